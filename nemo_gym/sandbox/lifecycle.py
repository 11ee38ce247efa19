"""No sandbox outlives the process that owns it: records on disk, a sweep on start, counts.

Every process that starts sandboxes gets an *owner* directory under the state root
(``NEMO_GYM_SANDBOX_STATE_DIR``, default ``<tmp>/nemo_gym_sandboxes``), named after this host,
its pid and the pid's start time (so a reused pid is never mistaken for its owner). In it, one
JSON record per live sandbox (what a reaper needs to remove it: a working tree, a container id)
and one file per running confined process group. Records are written before the resource
exists and removed after it is gone.

- Normal end: :meth:`AsyncSandbox.stop` (and ``async with``) remove the sandbox and its record.
- Deadline: a sandbox is stopped at its ``ttl_s``, or by default at the rollout deadline
  (``NEMO_GYM_ROLLOUT_TIMEOUT_S``, 1,200 s): no rollout may last longer than that.
- The owner stops (``ng_run`` stop, SIGTERM, normal exit): the server's shutdown (and an
  ``atexit`` hook, for scripts) removes every sandbox it still holds.
- The owner is killed (SIGKILL): its confined processes kill themselves with it (a parent-death
  signal), and the next process that creates a provider *sweeps*: every owner directory whose
  owner is gone has its groups killed and its sandboxes removed by the reaper of their kind
  (the docker provider also removes labelled containers of dead owners that have no record).

Counts (started, stopped, swept, active) are per process: :func:`sandbox_counts`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("nemo_gym.sandbox")

STATE_DIR_ENV = "NEMO_GYM_SANDBOX_STATE_DIR"
OWNER_FILE = "owner.json"

Reaper = Callable[[dict[str, Any]], None]


def state_root() -> Path:
    """Where owners keep their records (``NEMO_GYM_SANDBOX_STATE_DIR`` or the temp dir)."""
    return Path(os.environ.get(STATE_DIR_ENV) or Path(tempfile.gettempdir()) / "nemo_gym_sandboxes")


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields are counted after the last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def owner_id_of(pid: int) -> str:
    """The owner id of process ``pid`` on this host."""
    return f"{socket.gethostname()}-{pid}-{process_start_ticks(pid) or 0}"


def owner_alive(owner_id: str) -> bool:
    """Whether the process ``owner_id`` names still runs (ids of other hosts count as alive:
    they are not ours to judge)."""
    parts = owner_id.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return True
    try:
        pid, ticks = int(parts[1]), int(parts[2])
    except ValueError:
        return True
    return process_start_ticks(pid) == ticks


class SandboxLedger:
    """This process's records, counts and sweep (one per process: :data:`LEDGER`)."""

    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0
        self.swept = 0
        self._lock = threading.Lock()
        self._owner_dir: Path | None = None
        self._owner_pid = 0
        self._swept_once = False
        self._reapers: dict[str, Reaper] = {}

    # ---- records -----------------------------------------------------------------------------
    def owner_dir(self) -> Path:
        """This process's owner directory (created on first use; a forked child gets its own)."""
        with self._lock:
            if self._owner_dir is None or self._owner_pid != os.getpid():
                pid = os.getpid()
                path = state_root() / owner_id_of(pid)
                (path / "sandboxes").mkdir(parents=True, exist_ok=True)
                (path / "groups").mkdir(exist_ok=True)
                (path / OWNER_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
                self._owner_dir, self._owner_pid = path, pid
                atexit.register(self.stop_all)
                _hook_into_servers(self.counts, self.stop_all)
            return self._owner_dir

    @property
    def owner_id(self) -> str:
        """This process's owner id (the name of its owner directory)."""
        return self.owner_dir().name

    def register_reaper(self, kind: str, reaper: Reaper) -> None:
        """``reaper(record)`` removes a sandbox of ``kind`` synchronously (at exit, in a sweep)."""
        self._reapers[kind] = reaper

    def record(self, sandbox_id: str, kind: str, **details: Any) -> None:
        """Note a sandbox before it exists, so that a crash leaves something to sweep."""
        path = self.owner_dir() / "sandboxes" / f"{sandbox_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)  # stop_all() may have removed it
        path.write_text(json.dumps({"sandbox_id": sandbox_id, "kind": kind, **details}))
        with self._lock:
            self.started += 1

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: drop its record and count it stopped."""
        path = self.owner_dir() / "sandboxes" / f"{sandbox_id}.json"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            with self._lock:
                self.stopped += 1

    def add_group(self, pgid: int) -> None:
        """A confined process group started (recorded with its leader's start time)."""
        groups = self.owner_dir() / "groups"
        groups.mkdir(parents=True, exist_ok=True)
        (groups / f"{pgid}-{process_start_ticks(pgid) or 0}").touch()

    def remove_group(self, pgid: int) -> None:
        """A confined process group ended (and was killed)."""
        for path in (self.owner_dir() / "groups").glob(f"{pgid}-*"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @property
    def active(self) -> int:
        """Sandboxes of this process not yet stopped."""
        if self._owner_dir is None:
            return 0
        return sum(1 for _ in (self._owner_dir / "sandboxes").glob("*.json"))

    def counts(self) -> dict[str, int]:
        """``{"started", "stopped", "swept", "active"}`` for this process."""
        return {"started": self.started, "stopped": self.stopped, "swept": self.swept, "active": self.active}

    # ---- ending ------------------------------------------------------------------------------
    def stop_all(self) -> None:
        """Remove every sandbox this process still holds (at exit; synchronous)."""
        if self._owner_dir is None or self._owner_pid != os.getpid():
            return
        removed = _reap_owner(self._owner_dir, self._reapers, remove_dir=True)
        with self._lock:
            self.stopped += removed

    def sweep(self, *, force: bool = False) -> int:
        """Remove what owners that no longer run left behind; returns how many sandboxes. Runs
        once per process unless ``force``."""
        if self._swept_once and not force:
            return 0
        self._swept_once = True
        root = state_root()
        if not root.is_dir():
            return 0
        mine = self.owner_dir().name
        total = 0
        for owner in root.iterdir():
            if owner.name == mine or not owner.is_dir() or owner_alive(owner.name):
                continue
            total += _reap_owner(owner, self._reapers, remove_dir=True)
        if total:
            logger.warning("sandbox sweep: removed %d sandbox(es) left by owners that are gone", total)
        with self._lock:
            self.swept += total
        return total

    def add_swept(self, count: int) -> None:
        """Count sandboxes a provider swept by itself (containers found by label)."""
        with self._lock:
            self.swept += count


def current_rollout_id() -> str | None:
    """The rollout id of the request being served (``/ng-rollout/<id>`` prefix), if any."""
    from nemo_gym.serving.request_context import _current_rollout_id

    return _current_rollout_id.get()


def _hook_into_servers(counts: Callable[[], dict[str, int]], stop_all: Callable[[], None]) -> None:
    """A server process answers ``GET /`` with ``"sandboxes": {started, stopped, swept, active}``
    and removes its sandboxes when it stops."""
    from nemo_gym.serving.process_hooks import LIVENESS_METRICS, SHUTDOWN_CLEANUPS

    LIVENESS_METRICS["sandboxes"] = counts
    SHUTDOWN_CLEANUPS["sandboxes"] = stop_all


def _reap_owner(owner: Path, reapers: dict[str, Reaper], *, remove_dir: bool) -> int:
    for group in (owner / "groups").glob("*-*"):
        pgid_text, _, ticks_text = group.name.partition("-")
        with contextlib.suppress(ValueError):
            pgid, ticks = int(pgid_text), int(ticks_text)
            # A group whose leader is gone may still have members; a reused pid must not be hit.
            if process_start_ticks(pgid) in (ticks, None):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            group.unlink()
    removed = 0
    for path in (owner / "sandboxes").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        reaper = reapers.get(record.get("kind", ""))
        if reaper is None:
            continue  # a provider not loaded in this process: left for one that has it
        try:
            reaper(record)
        except Exception as exc:  # noqa: BLE001 - one stuck sandbox must not stop the others
            logger.warning("could not remove sandbox %s: %s", record.get("sandbox_id"), exc)
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        removed += 1
    if remove_dir and not any((owner / "sandboxes").glob("*.json")):
        shutil.rmtree(owner, ignore_errors=True)
    return removed


LEDGER = SandboxLedger()


def sandbox_counts() -> dict[str, int]:
    """Sandboxes started, stopped, swept and still active in this process."""
    return LEDGER.counts()
