"""harness_agent: train on a third-party agent program (a black box) by capturing its model calls.

One rollout: ``/seed_session`` with the row; the configured ``command`` runs as a child process
in a fresh working directory, pointed at a rollout-scoped model URL served by the capture proxy
(``capture.py``) inside this agent; the proxy forwards every call to the policy model and
records it with its token IDs and log-probs; when the program exits (or hits its limits) the
rollout's response is assembled from the captured calls and sent to ``/verify``: only what the
policy model produced and the tool outputs the stack itself returned are graded; whatever the
program wrote on its own (messages, outputs of tools it ran itself) is kept under
``harness.program_items``, never graded as the policy's.

The program sees, in its environment:

- ``OPENAI_BASE_URL`` (``<proxy>/r/<token>/v1``) and ``OPENAI_API_KEY``: any ``openai`` client,
  Responses or Chat Completions, works unchanged;
- ``NEMO_GYM_TOOLS_URL`` (``<proxy>/r/<token>/tools``): ``POST <url>/<tool>`` runs a tool of the
  resources server in this rollout's session (the answer is the tool's output text);
- ``NEMO_GYM_TASK_FILE``: ``task.json`` in its working directory: what a model would see of the
  row, ``{"responses_create_params": {input, instructions, tools, tool_choice, ...}}`` (the keys
  in ``task_params``), plus only the row fields named in ``task_row_fields``. Never the
  verifier's fields (``expected_answer``, ``verifier_metadata``, ...): the program is untrusted.

Only the tools the row offers may be called through the tools URL (anything else, ``verify``
and ``seed_session`` included, is "no such tool").

Working directory and limits reuse code_gen's sandbox limits (CPU time, wall time, memory,
file size, open files, output cap); the directory is deleted afterwards. The program runs in
its own PID namespace with its own ``/proc`` where the system allows it (``confine.py``): every
process it started dies with the rollout, ``setsid`` or not, and it cannot read other processes'
``/proc`` entries; it sees none of the stack's Unix socket directories and no other rollout's
working directory, and its ``$TMPDIR`` is its own (``<workdir>/tmp``); it inherits no descriptor
but its stdio, and its output is read only until the deadline.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field

from nemo_gym.base_responses_api_agent import (
    HTTPError,
    SimpleResponsesAPIAgent,
    call_json,
    offered_tools,
    rollout_deadline,
    row_create_params,
)
from nemo_gym.server_utils import local_socket
from resources_servers.code_gen.sandbox import SandboxLimits
from responses_api_agents.harness_agent.capture import CaptureProxy, RolloutCapture
from responses_api_agents.harness_agent.confine import run_confined
from responses_api_agents.simple_agent.app import SimpleAgentConfig

AGENT_DIR = Path(__file__).resolve().parent
_TAIL_BYTES = 4096
# What a model is shown of a row: the prompt and the tools (and how it may use them).
DEFAULT_TASK_PARAMS = ("input", "instructions", "tools", "tool_choice", "parallel_tool_calls")


class HarnessAgentConfig(SimpleAgentConfig):
    """simple_agent's server refs and timeouts, plus the program to run.

    ``command``: the argv; each part may use ``{python}`` (this interpreter), ``{agent_dir}``
    (this folder) and ``{workdir}``. ``env``: extra environment variables for it.
    ``max_model_calls``: calls the proxy forwards per rollout (then 429).
    ``cpu_time_s``, ``wall_time_s``, ``memory_mb``, ``file_size_mb``, ``open_files``,
    ``max_output_bytes``: the child's limits (code_gen's :class:`SandboxLimits`).
    ``task_params``: the keys of the row's ``responses_create_params`` written to ``task.json``;
    ``task_row_fields``: top-level row fields written too (default none: the verifier's fields
    stay out of the untrusted program's reach).
    ``program_uid``: run each program as this uid (and gid) instead of the agent's user, its
    working directory given to it; needs the agent to run as root, and the command's files
    (interpreter, scripts) readable by that uid. None (default): the agent's user.
    """

    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    max_model_calls: int = Field(default=50, ge=1)
    cpu_time_s: float = Field(default=60.0, gt=0)
    wall_time_s: float = Field(default=300.0, gt=0)
    memory_mb: int = Field(default=4096, ge=64)
    file_size_mb: int = Field(default=64, ge=1)
    open_files: int = Field(default=256, ge=16)
    max_output_bytes: int = Field(default=1024 * 1024, ge=1024)
    task_params: list[str] = Field(default_factory=lambda: list(DEFAULT_TASK_PARAMS))
    task_row_fields: list[str] = Field(default_factory=list)
    program_uid: int | None = Field(default=None, ge=1)


class HarnessAgent(SimpleResponsesAPIAgent):
    """Runs the configured program per rollout and verifies what its captured model calls produced."""

    config: HarnessAgentConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proxy = CaptureProxy()
        if self.config.program_uid is not None and os.geteuid() != 0:
            raise ValueError(f"agent {self.name}: program_uid needs the agent to run as root")
        self._workroot: str | None = None
        self.limits = SandboxLimits(
            cpu_time_s=self.config.cpu_time_s,
            wall_time_s=self.config.wall_time_s,
            memory_mb=self.config.memory_mb,
            file_size_mb=self.config.file_size_mb,
            open_files=self.config.open_files,
            max_output_bytes=self.config.max_output_bytes,
        )

    @property
    def workroot(self) -> str:
        """Where every rollout's working directory lives (made on first use); a program sees only
        its own (confine.py)."""
        if self._workroot is None:
            self._workroot = tempfile.mkdtemp(prefix="ng_harness_")
            if self.config.program_uid is not None:
                os.chmod(self._workroot, 0o711)  # its own directory reachable, the others' names not listed
        return self._workroot

    async def on_shutdown(self) -> None:
        """Stop the capture proxy; remove the working directories' root."""
        await self.proxy.stop()
        if self._workroot is not None:
            await asyncio.to_thread(shutil.rmtree, self._workroot, True)

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One rollout: seed, run the program against its proxy URL, verify the assembled response.

        The verify answer gains ``harness`` (exit status, ``status`` ``ok``/``failed``/``timeout``/
        ``output_limit``, wall seconds, model and tool call counts, stderr tail, and
        ``program_items``: what the program wrote between model calls on its own, kept for the
        record and never graded). A policy-model or tool fault seen by the proxy fails the rollout
        with its failure class, never a reward.
        """
        params = row_create_params(body)  # the row's request must be well formed (a 422 names the field)
        await self.proxy.start()
        rollout = self.rollout_client(body)  # NeMo Gym's training-token capture, when on for this agent
        resources = self.config.resources_server.name
        hop = self.config.hop_timeout_s
        capture = RolloutCapture(
            rollout=rollout,
            model_server=self.config.model_server.name,
            resources_server=resources,
            max_model_calls=self.config.max_model_calls,
            hop_timeout_s=hop,
            tools=offered_tools(params, self.tools_url_extra()),
        )
        async with rollout_deadline(self.config.rollout_timeout_s, self.name):
            await call_json(rollout, resources, "/seed_session", body, timeout_s=hop)
            url = self.proxy.open(capture)
            try:
                outcome = await self.run_program(url, body)
            finally:
                self.proxy.close(url)
            if capture.fault is not None:
                raise capture.fault
            response = capture.assembled_response()
            verified = await call_json(
                rollout, resources, "/verify", {**body, "response": response}, timeout_s=hop
            )
        outcome.update(
            model_calls=len(capture.calls),
            tool_calls=capture.tool_calls,
            program_items=capture.program_items(),
        )
        return {**verified, "harness": outcome}

    def tools_url_extra(self) -> list[str]:
        """Tools callable through the tools URL besides those the row offers (``allowed_tools``)."""
        return list(self.config.allowed_tools)

    def task_view(self, row: dict[str, Any]) -> dict[str, Any]:
        """What the program may know of a row: ``task_params`` of its request, ``task_row_fields``."""
        params = row.get("responses_create_params") or {}
        view: dict[str, Any] = {f: row[f] for f in self.config.task_row_fields if f in row}
        view["responses_create_params"] = {k: params[k] for k in self.config.task_params if k in params}
        return view

    async def run_program(self, url: str, row: dict[str, Any]) -> dict[str, Any]:
        """Run the command once in a fresh working directory; its outcome (never raises for the
        program's own failure)."""
        workdir = tempfile.mkdtemp(prefix="rollout_", dir=self.workroot)
        try:
            os.mkdir(Path(workdir, "tmp"))
            task_file = Path(workdir, "task.json")
            task_file.write_bytes(orjson.dumps(self.task_view(row)))
            argv, env = self.program(url, workdir, row)
            if self.config.program_uid is not None:
                await asyncio.to_thread(_give, workdir, self.config.program_uid)
            return await self._supervise(argv, workdir, env)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def program(self, url: str, workdir: str, row: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The argv and the whole environment of the program for one rollout (subclasses that run
        a particular CLI override it). ``url`` is the rollout's proxy base URL, ``workdir`` its
        fresh working directory (``task.json`` already written)."""
        fields = {"python": sys.executable, "agent_dir": str(AGENT_DIR), "workdir": workdir}
        try:
            argv = [part.format(**fields) for part in self.config.command]
        except (KeyError, IndexError) as exc:
            raise HTTPError(500, f"agent {self.name}: command has an unknown placeholder {exc}") from None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "TMPDIR": str(Path(workdir, "tmp")),  # its own, not the stack's
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_KEY": "nemo-gym-capture-proxy",
            "NEMO_GYM_TOOLS_URL": f"{url}/tools",
            "NEMO_GYM_TASK_FILE": str(Path(workdir, "task.json")),
            **self.config.env,
        }
        return argv, env

    async def _supervise(self, argv: list[str], workdir: str, env: dict[str, str]) -> dict[str, Any]:
        child = self.limits.process_limits().as_child_limits()
        try:
            result = await run_confined(
                argv,
                cwd=workdir,
                env=env,
                wall_time_s=self.limits.wall_deadline_s,
                cpu_time_s=int(child["cpu_time_s"]) + 1,
                memory_bytes=child["memory_bytes"],
                file_size_bytes=child["file_size_bytes"],
                open_files=child["open_files"],
                max_output_bytes=self.limits.max_output_bytes,
                stderr_bytes=_TAIL_BYTES,
                hide=local_socket.socket_dirs(),
                private_root=self.workroot,
                uid=self.config.program_uid,
            )
        except OSError as exc:
            raise HTTPError(500, f"agent {self.name}: cannot start {argv[0]!r}: {exc}") from None
        return {
            "status": result["status"],
            "returncode": result["returncode"],
            "wall_s": result["wall_s"],
            "stdout_tail": result["stdout"][-_TAIL_BYTES:].decode("utf-8", "replace"),
            "stderr_tail": result["stderr"].decode("utf-8", "replace"),
            "confinement": result["confined"],
        }


def _give(workdir: str, uid: int) -> None:
    """Make the working directory (and what was written into it) the program's own."""
    os.chown(workdir, uid, uid)
    for root, dirs, files in os.walk(workdir):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


if __name__ == "__main__":
    HarnessAgent.run_webserver()
