"""Test support: real servers on 127.0.0.1, driven from synchronous test code.

- :func:`running_server` serves one server object in this process on a free loopback port.
- :func:`running_stack` starts a whole stack from config files with ``ng_run``'s machinery
  (real child processes) and stops it afterwards.
- :class:`SyncClient` makes blocking JSON calls with per-server cookie jars, for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from nemo_gym.launch.config import load_config, project_root
from nemo_gym.launch.launcher import StackHandle
from nemo_gym.serving.server import BaseServer, auth_headers, bind_socket

# The deterministic scripted test model's config, relative to the project root.
SCRIPTED_MODEL_CONFIG = "responses_api_models/scripted_model/configs/scripted_model.yaml"


@contextlib.contextmanager
def running_server(server: BaseServer, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``server`` on a free port of ``host`` in a background thread; yields its base URL."""
    sock = bind_socket(host, 0)
    url = f"http://{host}:{sock.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sock, register=False, embedded=True))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name=f"server-{server.name}", daemon=True)
    thread.start()
    try:
        with SyncClient() as client:
            deadline = time.monotonic() + 30
            while True:
                if done.is_set():
                    raise RuntimeError(f"server {server.name!r} stopped while starting") from (
                        failure[0] if failure else None
                    )
                try:
                    client.wait_healthy(url, timeout_s=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        yield url
    finally:
        uv = getattr(server, "uvicorn_server", None)
        if uv is not None:
            uv.should_exit = True
        done.wait(10)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def running_app(app: Any, host: str = "127.0.0.1", header_timeout_s: float = 15.0) -> Iterator[str]:
    """Serve any ASGI app (the head server's, a fake upstream's) on a free loopback port; yields its URL."""
    from nemo_gym.serving.server import make_uvicorn_server

    sock = bind_socket(host, 0)
    url = f"http://{host}:{sock.getsockname()[1]}"
    uv = make_uvicorn_server(app, embedded=True, header_timeout_s=header_timeout_s)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(uv.serve(sockets=[sock])), name="app", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the app at {url} did not start")
        time.sleep(0.01)
    try:
        yield url
    finally:
        uv.should_exit = True
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def running_stack(
    config_paths: Sequence[str], overrides: Sequence[str] = (), **stack_kwargs: Any
) -> Iterator[StackHandle]:
    """Start a stack from config files on a free head port; stop it when the block ends."""
    argv = ["+config_paths=[" + ",".join(config_paths) + "]", "++head_server.port=0", *overrides]
    handle = StackHandle.start(load_config(argv), **stack_kwargs)
    try:
        yield handle
    finally:
        handle.stop()


@contextlib.contextmanager
def ng_run_process(
    config_paths: Sequence[str],
    overrides: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 90.0,
) -> Iterator[tuple[Any, str]]:
    """``ng_run`` as a real subprocess (console script of this interpreter) on a free head port.

    Yields ``(process, head_url)`` once it reports every server healthy; stops it (SIGINT, then
    SIGKILL) when the block ends. Its output is drained by a thread so it never blocks on a pipe.
    """
    import re
    import signal
    import subprocess

    argv = [
        str(Path(sys.executable).parent / "ng_run"),
        "+config_paths=[" + ",".join(config_paths) + "]",
        "++head_server.port=0",
        *overrides,
    ]
    proc = subprocess.Popen(
        argv, cwd=project_root(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"Head server: (http://\S+)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout_s) or not found:
            raise AssertionError("ng_run did not report healthy:\n" + "".join(lines[-60:]))
        yield proc, found[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(5)


def http_call(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """One request with exactly these headers (http.client adds only Host and Content-Length):
    ``(status, parsed JSON or text)``. ``body`` goes as JSON, ``raw`` as it is (no Content-Type
    unless given); ``token`` adds ``Authorization: Bearer``. For tests of what servers refuse."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    sent = dict(headers or {})
    data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
    if raw is None and data is not None:
        sent.setdefault("Content-Type", "application/json")
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, body=data, headers=sent)
        resp = conn.getresponse()
        text = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return resp.status, text.decode(errors="replace")


class SyncClient:
    """Blocking JSON calls over real HTTP, with one cookie jar per base URL (for tests)."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.cookies: dict[str, dict[str, str]] = {}
        self._loop = asyncio.new_event_loop()
        self._http: aiohttp.ClientSession | None = None

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session and the private event loop."""
        if self._http is not None:
            self._loop.run_until_complete(self._http.close())
        self._loop.close()

    def request(
        self, method: str, url: str, json: Any = None, *, raw: bytes | None = None
    ) -> tuple[int, Any]:
        """Send one request; returns ``(status, parsed JSON or text)``. Cookies are kept per base URL."""
        return self._loop.run_until_complete(self._request(method, url, json, raw))

    def post(self, url: str, json: Any = None, **kwargs: Any) -> tuple[int, Any]:
        """POST JSON (see :meth:`request`)."""
        return self.request("POST", url, json, **kwargs)

    def get(self, url: str) -> tuple[int, Any]:
        """GET (see :meth:`request`)."""
        return self.request("GET", url)

    def wait_healthy(self, url: str, timeout_s: float = 10.0) -> None:
        """Poll ``GET /`` until it answers 200."""
        self._loop.run_until_complete(self._wait_healthy(url, timeout_s))

    async def _wait_healthy(self, url: str, timeout_s: float) -> None:
        deadline = self._loop.time() + timeout_s
        while True:
            try:
                status, _ = await self._request("GET", url + "/", None, None, timeout_s=0.5)
                if status == 200:
                    return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if self._loop.time() > deadline:
                raise TimeoutError(f"{url} did not become healthy within {timeout_s}s")
            await asyncio.sleep(0.02)

    async def _request(
        self, method: str, url: str, json: Any, raw: bytes | None, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        if self._http is None:
            self._http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), headers=auth_headers())
        base = "/".join(url.split("/")[:3])
        jar = self.cookies.setdefault(base, {})
        headers = {"Content-Type": "application/json"}
        if jar:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in jar.items())
        data = raw if raw is not None else (orjson.dumps(json) if json is not None else None)
        async with self._http.request(
            method,
            url,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s or self.timeout_s),
        ) as resp:
            jar.update({k: m.value for k, m in resp.cookies.items()})
            body = await resp.read()
            try:
                return resp.status, orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                return resp.status, body.decode(errors="replace")


def compat_root() -> Path:
    """Where NeMo Gym's recorded rows are: ``$NEMO_GYM_COMPAT_DIR``, else the copy kept in the
    project (``tests/compat/nemo_gym``, so a fresh clone runs every compat test), else
    ``../shared/compat/nemo_gym``."""
    base = os.environ.get("NEMO_GYM_COMPAT_DIR")
    if base:
        return Path(base)
    kept = project_root() / "tests" / "compat" / "nemo_gym"
    return kept if kept.is_dir() else project_root().parent / "shared" / "compat" / "nemo_gym"


def compat_dir(environment: str) -> Path:
    """NeMo Gym's recorded rows for ``environment`` (see :func:`compat_root`)."""
    return compat_root() / environment


@contextlib.contextmanager
def running_agent(
    resources_server: BaseServer,
    model_server: BaseServer,
    *,
    agent_class: type[BaseServer] | None = None,
    **agent_fields: Any,
) -> Iterator[str]:
    """An environment, a model and an agent between them, all in this process; yields the agent's URL.

    The agent (``agent_class``, default simple_agent's) reaches the two servers by the names
    ``env`` and ``model`` (static URLs, no head server). ``agent_fields`` are extra agent
    settings (``max_steps``, ...).
    """
    from nemo_gym.serving.server_client import ServerClient

    if agent_class is None:
        from responses_api_agents.simple_agent.app import SimpleAgent

        agent_class = SimpleAgent
    with running_server(resources_server) as env_url, running_server(model_server) as model_url:
        agent = agent_class(
            {
                "name": "agent",
                "resources_server": {"type": "resources_servers", "name": "env"},
                "model_server": {"type": "responses_api_models", "name": "model"},
                **agent_fields,
            },
            server_client=ServerClient(static_urls={"env": env_url, "model": model_url}),
        )
        with running_server(agent) as agent_url:
            yield agent_url


def collect_with_stack(
    config_paths: Sequence[str],
    *,
    agent_name: str | None,
    input_jsonl_fpath: str | Path,
    output_jsonl_fpath: str | Path,
    **fields: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """Start a stack from config files, collect rollouts on a JSONL file, stop it.

    Returns the collection summary and the result rows. ``fields`` are further collector
    arguments (``num_repeats``, ``limit``, ...).
    """
    from nemo_gym.rollout_collection import RolloutCollectionHelper

    config = {
        "agent_name": agent_name,
        "input_jsonl_fpath": str(input_jsonl_fpath),
        "output_jsonl_fpath": str(output_jsonl_fpath),
        **fields,
    }
    with running_stack(config_paths) as handle:
        summary = asyncio.run(
            RolloutCollectionHelper().run_from_config(
                {**config, "head_server": handle.head_server_config}, verbose=False
            )
        )
    output = Path(output_jsonl_fpath)
    rows = (
        [orjson.loads(line) for line in output.read_bytes().splitlines() if line.strip()]
        if output.exists()
        else []
    )
    return summary, rows


def distinct_example_rows(environment_dir: str | Path, count: int) -> list[dict[str, Any]]:
    """``count`` copies of an environment's first example row, each with its own last user message."""
    raw = (project_root() / environment_dir / "data" / "example.jsonl").read_bytes().splitlines()[0]
    rows = []
    for i in range(count):
        row = orjson.loads(raw)
        row["responses_create_params"]["input"][-1]["content"] = f"What is the weather in city number {i}?"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    """Write ``rows`` as JSONL; returns ``path``."""
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    return path


def collector_argv(head_port: int, agent: str, source: Path, out: Path, *options: str) -> list[str]:
    """The command line of ``ng_collect_rollouts`` (as a module of this Python) against a running stack."""
    return [
        sys.executable,
        "-m",
        "nemo_gym.rollout_collection",
        f"++head_server.port={head_port}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={source}",
        f"+output_jsonl_fpath={out}",
        *options,
    ]


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSONL file (test data; blank lines skipped)."""
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


def collect_examples(
    environment_folder: str | Path,
    output_jsonl_fpath: str | Path,
    *extra_config_paths: str | Path,
    route_by_agent_ref: bool = False,
    agent: str = "simple_agent",
    **fields: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """An environment's end-to-end check: its ``data/example.jsonl`` through the scripted model.

    The stack is ``configs/<env>.yaml``, the scripted model and ``configs/scripted_policy.yaml``
    (the environment's own scripts), then ``extra_config_paths``. Rows go to
    ``<env>_<agent>`` (``agent`` defaults to ``simple_agent``), or with ``route_by_agent_ref`` to the agent each row's ``agent_ref``
    names (no fallback). ``fields`` are further collector arguments. Returns what
    :func:`collect_with_stack` does.
    """
    folder = Path(environment_folder)
    configs = [
        str(folder / "configs" / f"{folder.name}.yaml"),
        SCRIPTED_MODEL_CONFIG,
        str(folder / "configs" / "scripted_policy.yaml"),
        *map(str, extra_config_paths),
    ]
    return collect_with_stack(
        configs,
        # None is the collector's own default: no fallback agent, rows route by agent_ref.
        agent_name=None if route_by_agent_ref else f"{folder.name}_{agent}",
        input_jsonl_fpath=folder / "data" / "example.jsonl",
        output_jsonl_fpath=output_jsonl_fpath,
        **fields,
    )


def post_verify(
    url: str, row: dict[str, Any], response: dict[str, Any], status: int = 200, *, timeout_s: float = 60.0
) -> dict[str, Any]:
    """POST ``row`` with ``response`` to ``<url>/verify`` in a fresh session; returns the body.

    Fails the test (naming the body) unless the answer's status is ``status``.
    """
    with SyncClient(timeout_s=timeout_s) as client:
        got, body = client.post(url + "/verify", {**row, "response": response})
    assert got == status, body
    return body


def verify_text(
    url: str, row: dict[str, Any], text: str | None, status: int = 200, *, timeout_s: float = 60.0
) -> dict[str, Any]:
    """:func:`post_verify` with a response of one assistant message, or no output when ``text`` is None."""
    from nemo_gym.response_items import message_item

    output = [] if text is None else [message_item(text)]
    return post_verify(url, row, {"output": output}, status, timeout_s=timeout_s)


def replay_recorded(
    url: str,
    compat: Path,
    join: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
    *,
    timeout_s: float = 60.0,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """NeMo Gym's recorded rollouts (``compat``: a :func:`compat_dir`) verified by the server at ``url``.

    Every row of ``example.jsonl`` is seeded first (each must answer 200: the rows run
    unchanged), then each row of ``example_rollouts.jsonl`` is verified in the same client: as
    recorded, or as ``join(recorded, source)`` where ``source`` is the first example row with
    the same prompt (the content of the last input item). Every verify must answer 200.
    Returns ``(recorded, our verify body)`` pairs in file order.
    """
    examples = read_jsonl(compat / "example.jsonl")

    def prompt(row: dict[str, Any]) -> Any:
        return row["responses_create_params"]["input"][-1]["content"]

    pairs = []
    with SyncClient(timeout_s=timeout_s) as client:
        for row in examples:
            status, body = client.post(url + "/seed_session", row)
            assert status == 200, (row, body)
        for recorded in read_jsonl(compat / "example_rollouts.jsonl"):
            request = recorded
            if join is not None:
                source = next(row for row in examples if prompt(row) == prompt(recorded))
                request = join(recorded, source)
            status, ours = client.post(url + "/verify", request)
            assert status == 200, ours
            pairs.append((recorded, ours))
    return pairs


@dataclass(frozen=True)
class ParityCase:
    """One verify case taken from NeMo Gym's own tests for a same-named environment.

    ``row`` and ``output`` (the response's output items) are the inputs NeMo Gym's test used;
    ``reward`` is the reward NeMo Gym's server gives and ``expect`` any further verify-answer
    fields its test checks. ``server`` names the server configuration the case needs (each
    environment's tests map names to configs).
    """

    name: str
    row: dict[str, Any]
    output: list[dict[str, Any]]
    reward: float
    expect: dict[str, Any] = field(default_factory=dict)
    server: str = "default"


# Every fifth case (0-based index 4, 9, ...) is held out: checked, but never used to tune fixes.
HELD_OUT_EVERY = 5


def parity_cases(cases: Sequence[ParityCase], *, held_out: bool) -> list[ParityCase]:
    """The tuning cases (``held_out=False``) or the held-out ones, by the fixed every-fifth rule."""
    return [
        case for index, case in enumerate(cases) if (index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out
    ]


def check_parity(url: str, case: ParityCase, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """POST the case to ``<url>/verify``; assert NeMo Gym's reward and fields. Returns our answer."""
    body = post_verify(url, case.row, {"output": case.output}, timeout_s=timeout_s)
    got = {"reward": body["reward"], **{key: body.get(key) for key in case.expect}}
    assert got == {"reward": case.reward, **case.expect}, f"{case.name}: NeMo Gym gives {case.reward}"
    return body


@contextlib.contextmanager
def lazy_servers(make: Callable[[str], BaseServer]) -> Iterator[Callable[[str], str]]:
    """Serve ``make(name)`` on first use of each name (see :func:`running_server`); yields name → URL.

    For tests whose cases need several configurations of one server: only those used start.
    """
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}

        def url(name: str) -> str:
            if name not in urls:
                urls[name] = stack.enter_context(running_server(make(name)))
            return urls[name]

        yield url
