"""Run NeMo Gym's own environment folders, unchanged, against this package.

The ``nemo-gym`` wheel on the package index ships NeMo Gym's resources servers, agents and model
adapters. This script fetches that wheel with ``pip download`` (never installs it: its
``nemo_gym`` package would shadow ours), unpacks it into a cache outside the repository, copies
each folder into a scratch tree where ``resources_servers.<name>.app`` imports with *our*
``nemo_gym``, installs what the folder's ``requirements.txt`` (or, without one, its ``pyproject.toml``) asks for that the current
environment lacks (into a scratch virtual environment layered on the current one), imports the
folder's ``app.py`` and runs the folder's own tests with pytest.

It prints one row per folder (imports, tests passed/failed, first failure) and, last,
``corpus: N/M folders pass their own tests``.

Each folder is also classified, by a static rule over its files, as needing a GPU, external
network or private data (see ``classify_folder``); ``--runnable`` keeps only the folders that
need none of them.

Examples::

    python scripts/nemo_gym_corpus.py --kind resources_servers --jobs 2
    python scripts/nemo_gym_corpus.py --folders example_single_tool_call,mcqa --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from nemo_gym.tools.authoring import NEMO_GYM_PYTEST_INI
from nemo_gym.tools.env_pull_needs import classify_folder, folder_needs
from nemo_gym.tools.env_pull_requirements import (
    GPU_REQUIREMENTS,
    folder_requirements,
    nemo_gym_dependencies,
    pip_arguments,
    requirement_name,
    runtime_requirements,
    unmet_requirements,
)
from nemo_gym.tools.env_pull_wheel import KINDS, fetch_wheel, list_folders
from nemo_gym.tools.failure_reason import failure_reason

DEFAULT_VERSION = "0.7.0"
DEFAULT_CACHE = Path(os.environ.get("NEMO_GYM_CORPUS_CACHE", Path.home() / ".cache" / "nemo_gym_corpus"))

# Requirements never installed by the corpus run: the GPU stacks ``gym env pull`` also leaves
# out, and unbabel-comet (it pulls torch).
HEAVY_REQUIREMENTS = GPU_REQUIREMENTS | {"tensorrt", "unbabel-comet"}
# Trees of the wheel besides the server folders that folders import from.
SHARED_TREES = ("benchmarks", "environment_servers", "environments")


@dataclasses.dataclass
class FolderResult:
    """The outcome of one folder: whether it imports and how its own tests went."""

    kind: str
    name: str
    needs: dict[str, str] = dataclasses.field(default_factory=dict)
    requirements_missing: list[str] = dataclasses.field(default_factory=list)
    install: str = "none needed"
    imports: bool = False
    import_error: str = ""
    tests_passed: int = 0
    tests_failed: int = 0
    tests_skipped: int = 0
    pytest_exit: int | None = None
    first_failure: str = ""
    seconds: float = 0.0

    @property
    def folder(self) -> str:
        """``kind/name``."""
        return f"{self.kind}/{self.name}"

    @property
    def passes(self) -> bool:
        """Its ``app.py`` imports and its own tests ran with none failing (pytest exited 0)."""
        return self.imports and self.pytest_exit == 0


# ---------------------------------------------------------------------------------------------
# The wheel


# ---------------------------------------------------------------------------------------------
# Scratch tree and environments


def prepare_scratch(wheel_root: Path, scratch: Path, folders: list[tuple[str, str]]) -> None:
    """Copy the folders into ``scratch/<kind>/<name>``, importable as ``<kind>.<name>``, and this
    repository's ``nemo_gym`` package into ``scratch/nemo_gym`` (so ``PARENT_DIR`` is the scratch tree).

    Each kind directory gets an ``__init__.py`` so that it wins over a same-named package of
    this repository further down ``sys.path``. The wheel's shared trees that folders import
    (helper packages without an ``app.py`` such as ``resources_servers/gymnasium``,
    ``benchmarks/``, ``environment_servers/``) are copied too.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "pytest.ini").write_text(NEMO_GYM_PYTEST_INI)
    ignore = shutil.ignore_patterns(".venv", "__pycache__")
    copies = list(folders)
    for kind in KINDS:
        base = wheel_root / kind
        if base.is_dir():
            copies += [(kind, p.name) for p in base.iterdir() if p.is_dir() and not (p / "app.py").exists()]
    # Folders a requested one imports or names (an agent built on its resources server's package:
    # aviary_agent imports resources_servers.aviary), so that it imports as it does in NeMo Gym.
    copies += sorted(
        {ref for kind, name in folders for ref in referenced_folders(wheel_root, kind, name)} - set(copies)
    )
    for kind, name in copies:
        (scratch / kind).mkdir(exist_ok=True)
        (scratch / kind / "__init__.py").touch()
        dest = scratch / kind / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(wheel_root / kind / name, dest, ignore=ignore)
    # This package too, beside the folders as NeMo Gym's sits beside its own: a folder that finds
    # its files through ``nemo_gym.PARENT_DIR`` (tests reading their own data) finds them here.
    import nemo_gym

    ours = Path(nemo_gym.__file__).resolve().parent
    if ours != (scratch / "nemo_gym").resolve():
        shutil.rmtree(scratch / "nemo_gym", ignore_errors=True)
        shutil.copytree(ours, scratch / "nemo_gym", ignore=ignore)
    for tree in SHARED_TREES:
        if (wheel_root / tree).is_dir() and not (scratch / tree).exists():
            shutil.copytree(wheel_root / tree, scratch / tree, ignore=ignore)
            # A regular package, so that `benchmarks.<name>` is the wheel's and not this
            # repository's `benchmarks` package further down sys.path.
            (scratch / tree / "__init__.py").touch()


_FOLDER_REFERENCE = re.compile(r"\b(resources_servers|responses_api_agents|responses_api_models)[./](\w+)")


def referenced_folders(wheel_root: Path, kind: str, name: str) -> set[tuple[str, str]]:
    """Other wheel folders that ``kind/name``'s Python and YAML files import or name."""
    found: set[tuple[str, str]] = set()
    for path in (wheel_root / kind / name).rglob("*"):
        if path.suffix not in (".py", ".yaml", ".yml") or not path.is_file():
            continue
        for ref_kind, ref_name in _FOLDER_REFERENCE.findall(path.read_text(errors="replace")):
            if (ref_kind, ref_name) != (kind, name) and (wheel_root / ref_kind / ref_name).is_dir():
                found.add((ref_kind, ref_name))
    return found


def layered_venv(
    cache_dir: Path, reqs: list[str], timeout: float, below: list[str] | None = None
) -> tuple[Path | None, str]:
    """A virtual environment holding ``reqs`` on top of the current one (cached by content).

    The site-packages of ``below`` (another layered venv) and of the current environment are
    appended through a ``.pth`` file, so pip installs only what is missing and nothing below
    changes. Returns ``(python, "")`` or ``(None, reason)``.
    """
    layers = [*(below or []), *(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())]
    key = hashlib.sha256("\n".join([*sorted(reqs), "--", *layers]).encode()).hexdigest()[:16]
    venv = cache_dir / "venvs" / key
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file():
        return python, ""
    (cache_dir / "venvs").mkdir(parents=True, exist_ok=True)
    # Several corpus runs (other sessions, other --folders) share the cache: one builds a given
    # venv while the others wait for it, instead of deleting it under a running pip.
    with open(cache_dir / "venvs" / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").is_file():
            return python, ""
        return _build_venv(venv, layers, reqs, timeout)


def _build_venv(venv: Path, layers: list[str], reqs: list[str], timeout: float) -> tuple[Path | None, str]:
    python = venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site_packages(venv) / "_nemo_gym_corpus_layers.pth").write_text("\n".join(layers) + "\n")
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *pip_arguments(reqs)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:]
        return None, f"pip install failed: {tail[0][:200] if tail else proc.returncode}"
    (venv / ".complete").touch()
    return python, ""


def site_packages(venv: Path) -> Path:
    """A venv's site-packages folder."""
    return next((venv / "lib").glob("python*/site-packages"))


def child_env(scratch: Path, allow_network: bool) -> dict[str, str]:
    """The environment of a folder's subprocesses: scratch tree first, then our ``nemo_gym``."""
    import nemo_gym

    ours = str(Path(nemo_gym.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(scratch), ours])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # NeMo Gym folders name their own files relative to the project root (prompts/x.yaml ...).
    env["NEMO_GYM_EXTRA_ROOTS"] = str(scratch)
    if not allow_network:
        # Fail fast instead of hanging on a remote host; loopback stays reachable.
        env.update(
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            http_proxy="http://127.0.0.1:9",
            https_proxy="http://127.0.0.1:9",
            HTTP_PROXY="http://127.0.0.1:9",
            HTTPS_PROXY="http://127.0.0.1:9",
            no_proxy="127.0.0.1,localhost,::1",
            NO_PROXY="127.0.0.1,localhost,::1",
        )
    return env


def run_bounded(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group; kill the whole group at ``timeout``."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out + f"\n[timed out after {timeout:.0f} s]"


def read_junit(path: Path) -> tuple[int, int, int, str]:
    """``(passed, failed, skipped, first_failure)`` from a pytest JUnit XML report."""
    if not path.is_file():
        return 0, 0, 0, ""
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    first = ""
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if not first:
                msg = (bad.get("message") or "").strip().splitlines()
                text = msg[0] if msg else ""
                if not text or text == "collection failure":
                    # A collection error's message says only that; the traceback names the cause.
                    text = failure_reason(bad.text or "") or text or bad.tag
                first = f"{case.get('name') or case.get('classname')}: {text}"[:240]
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, first


def run_folder(
    kind: str, name: str, scratch: Path, cache_dir: Path, opts: argparse.Namespace, env: dict[str, str]
) -> FolderResult:
    """Install, import and test one folder of the scratch tree."""
    started = time.monotonic()
    folder = scratch / kind / name
    result = FolderResult(kind=kind, name=name, needs=classify_folder(folder))
    base_python: Path = opts.base_python or Path(sys.executable)
    python = base_python
    provided = {requirement_name(r) for r in opts.base_requirements}
    missing = [
        r for r in unmet_requirements(folder_requirements(folder)) if requirement_name(r) not in provided
    ]
    result.requirements_missing = missing
    if missing:
        heavy = [r for r in missing if requirement_name(r) in HEAVY_REQUIREMENTS]
        if opts.install == "none":
            result.install = "skipped (--install none)"
        elif heavy:
            result.install = f"skipped: GPU-sized requirement {', '.join(heavy)}"
        else:
            below = [str(site_packages(base_python.parent.parent))] if opts.base_python else []
            venv_python, reason = layered_venv(cache_dir, missing, opts.install_timeout, below)
            result.install = reason or "installed"
            if venv_python is not None:
                python = venv_python

    modules = [f"{kind}.{name}.app"]
    if not (folder / "app.py").is_file():  # a grouped folder: one server per subfolder
        modules = [f"{kind}.{name}.{app.parent.name}.app" for app in sorted(folder.glob("*/app.py"))]
    code, out = run_bounded(
        [str(python), "-c", f"import importlib\nfor m in {modules!r}: importlib.import_module(m)"],
        folder,
        env,
        min(opts.timeout, 120),
    )
    result.imports = code == 0
    if not result.imports:
        result.import_error = failure_reason(out)

    junit = folder / ".corpus_junit.xml"
    code, out = run_bounded(
        [str(python), "-m", "pytest", "-c", str(scratch / "pytest.ini"), "--rootdir", str(scratch),
         "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "."],
        folder, env, opts.timeout,
    )  # fmt: skip
    result.pytest_exit = code
    result.tests_passed, result.tests_failed, result.tests_skipped, result.first_failure = read_junit(junit)
    if code is None:
        result.first_failure = f"timed out after {opts.timeout:.0f} s"
    elif code == 5:
        result.first_failure = "no tests collected"
    elif code != 0 and not result.first_failure:
        result.first_failure = failure_reason(out)
    result.seconds = time.monotonic() - started
    return result


# ---------------------------------------------------------------------------------------------
# Report


def format_table(results: list[FolderResult]) -> str:
    """One line per folder: folder, imports, passed/failed, needs, first failure."""
    rows = [("folder", "imports", "passed", "failed", "needs", "first failure")]
    for r in results:
        why = r.import_error if not r.imports else r.first_failure
        rows.append(
            (r.folder, "yes" if r.imports else "no", str(r.tests_passed), str(r.tests_failed),
             ",".join(sorted(r.needs)) or "-", why[:100])
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(row)) for row in rows
    ]
    return "\n".join(lines)


def summary_line(results: list[FolderResult]) -> str:
    """``corpus: N/M folders pass their own tests``."""
    return f"corpus: {sum(r.passes for r in results)}/{len(results)} folders pass their own tests"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default=DEFAULT_VERSION, help="nemo-gym wheel version (default %(default)s)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the wheel and venvs are kept")
    p.add_argument("--wheel-dir", type=Path, help="an already unpacked wheel to use instead of downloading")
    p.add_argument("--scratch", type=Path, help="scratch tree (default: a fresh temporary directory)")
    p.add_argument("--kind", action="append", choices=KINDS, help="folder kinds to run (default: all three)")
    p.add_argument("--folders", help="comma-separated folder names (or kind/name) to run")
    p.add_argument(
        "--runnable", action="store_true", help="only folders needing no GPU, network or private data"
    )
    p.add_argument("--jobs", type=int, default=2, help="folders run in parallel (default %(default)s)")
    p.add_argument(
        "--timeout", type=float, default=300, help="seconds per folder's tests (default %(default)s)"
    )
    p.add_argument("--install", choices=("missing", "none"), default="missing",
                   help="install a folder's unmet requirements into a layered venv, or not")  # fmt: skip
    p.add_argument("--install-timeout", type=float, default=600, help="seconds per pip install")
    p.add_argument("--allow-network", action="store_true", help="let tests reach hosts other than loopback")
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    p.add_argument("--list", action="store_true", help="list folders and their classification; run nothing")
    p.add_argument(
        "--user-path",
        action="store_true",
        help="per folder: a fresh project, gym env pull NAME==VERSION, gym env test, and gym eval run "
        "on the scripted model for a resources server with example data (see nemo_gym_corpus_user.py)",
    )
    p.add_argument(
        "--report", action="store_true", help="--user-path: print the table of --results; run nothing"
    )
    p.add_argument(
        "--results", type=Path, help="--user-path: append each folder's result here (JSON lines); "
        "folders already in it are skipped, so a cut run resumes",
    )  # fmt: skip
    return p.parse_args(argv)


def select_folders(wheel_root: Path, opts: argparse.Namespace) -> list[tuple[str, str]]:
    """The folders chosen by ``--kind``, ``--folders`` and ``--runnable``."""
    kinds = opts.kind or list(KINDS)
    # Grouped folders (servers one level down, sharing one requirements.txt) are listed too.
    folders = sorted(list_folders(wheel_root, kinds))
    if opts.folders:
        wanted = {w.strip() for w in opts.folders.split(",") if w.strip()}
        folders = [(k, n) for k, n in folders if n in wanted or f"{k}/{n}" in wanted]
        known = {n for _, n in folders} | {f"{k}/{n}" for k, n in folders}
        unknown = sorted(wanted - known)
        if unknown:
            raise SystemExit(f"unknown folder(s) in --folders: {', '.join(unknown)}")
    if opts.runnable:
        folders = [(k, n) for k, n in folders if not classify_folder(wheel_root / k / n)]
    return folders


def main(argv: list[str] | None = None) -> int:
    """Run the corpus; exit 0 (the table is the result, not the exit code)."""
    opts = parse_args(argv)
    opts.cache_dir.mkdir(parents=True, exist_ok=True)
    wheel_root = opts.wheel_dir or fetch_wheel(opts.version, opts.cache_dir / "wheels")
    folders = select_folders(wheel_root, opts)
    if opts.list:
        for k, n in folders:
            needs = classify_folder(wheel_root / k / n)
            print(f"{k}/{n}\t{'; '.join(f'{c}: {r}' for c, r in sorted(needs.items())) or '-'}")
        return 0
    if opts.user_path:
        return user_path_main(opts, wheel_root, folders)
    scratch = opts.scratch or Path(tempfile.mkdtemp(prefix="nemo_gym_corpus."))
    prepare_scratch(wheel_root, scratch, folders)
    env = child_env(scratch, opts.allow_network)
    dependencies = nemo_gym_dependencies(wheel_root)
    base = sorted({r for k, n in folders for r in runtime_requirements(scratch / k / n, dependencies)})
    opts.base_python, opts.base_requirements = None, base
    if base and opts.install != "none":
        print(f"installing NeMo Gym's own dependencies the folders use: {' '.join(base)}", file=sys.stderr)
        opts.base_python, reason = layered_venv(opts.cache_dir, base, opts.install_timeout)
        if opts.base_python is None:
            print(f"  not installed: {reason}", file=sys.stderr)
            opts.base_requirements = []
    results: list[FolderResult] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        futures = [pool.submit(run_folder, k, n, scratch, opts.cache_dir, opts, env) for k, n in folders]
        for fut in concurrent.futures.as_completed(futures):
            r = fut.result()
            results.append(r)
            state = "pass" if r.passes else "FAIL"
            print(
                f"[{len(results)}/{len(folders)}] {state} {r.folder} ({r.seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    results.sort(key=lambda r: (KINDS.index(r.kind), r.name))
    if opts.json:
        payload = {
            "version": opts.version,
            "summary": summary_line(results),
            "folders": [dict(dataclasses.asdict(r), folder=r.folder, passes=r.passes) for r in results],
        }
        opts.json.write_text(json.dumps(payload, indent=1))
    print(format_table(results))
    print(summary_line(results))
    if not opts.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def user_path_main(opts: argparse.Namespace, wheel_root: Path, folders: list[tuple[str, str]]) -> int:
    """``--user-path``: each folder through pull, test and eval run, one after another
    (``--jobs`` is ignored: each eval run starts a whole stack)."""
    from nemo_gym_corpus_user import (
        append_jsonl,
        layered_python,
        read_jsonl,
        run_user_path,
        user_path_summary,
        user_path_table,
    )

    results_path = opts.results or opts.cache_dir / f"user_path_{opts.version}.jsonl"
    done = read_jsonl(results_path) if results_path.is_file() else []
    seen = {r.folder for r in done}
    python = layered_python(opts.cache_dir / "venvs" / f"user_path_{opts.version}")
    scratch = opts.scratch or Path(tempfile.mkdtemp(prefix="nemo_gym_corpus_user."))
    os.environ["NEMO_GYM_WHEEL_CACHE"] = str((opts.wheel_dir or wheel_root).parent)
    todo = [] if opts.report else [(k, n) for k, n in folders if f"{k}/{n}" not in seen]
    for index, (kind, name) in enumerate(todo, 1):
        r = run_user_path(
            kind,
            name,
            opts.version,
            wheel_root,
            scratch,
            python,
            run_bounded,
            opts.timeout,
            opts.install_timeout,
        )
        append_jsonl(results_path, r)
        done.append(r)
        state = "pass" if r.passes else f"FAIL ({r.reason[:120]})"
        print(f"[{index}/{len(todo)}] {state} {r.folder} ({r.seconds:.1f} s)", file=sys.stderr, flush=True)
    for r in done:  # the classification rule as it is now, for every row (also those of a resumed run)
        r.needs = folder_needs(wheel_root / r.kind / r.name, wheel_root)
    done.sort(key=lambda r: (KINDS.index(r.kind), r.name))
    print(user_path_table(done))
    print(user_path_summary(done, opts.version))
    if not opts.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
