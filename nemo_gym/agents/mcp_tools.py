"""Agents calling tools of MCP servers: ours, or any third party's, over streamable HTTP or stdio.

An agent lists the MCP servers it may use in its config (``mcp_servers:``, one entry per server,
by name)::

    mcp_servers:
      weather:                    # streamable HTTP
        url: http://127.0.0.1:8123/mcp
        headers: {Authorization: Bearer ...}
      files:                      # stdio: a process the agent starts
        command: python
        args: [-m, my_mcp_server]
      environment:                # the resources server's own /mcp, from its /seed_session answer
        from_seed_session: true

At the start of a rollout the agent lists each server's tools and offers them to the model as
function tools (``namespace: true`` names them ``mcp__<server>__<tool>``); a function call to one
of them is sent to its server with ``tools/call``, and call and result are recorded in the
rollout as ``function_call`` / ``function_call_output`` items like any tool call.

What the model sees and what fails the rollout: a tool's own error (``isError``, an unknown tool,
arguments the server refuses) is the call's output, for the model to read. A fault of the MCP
server itself (no connection, no answer within the hop deadline, HTTP 401/403, 429 or 5xx, a
stdio process that died or does not start) raises :class:`~nemo_gym.agents.hop_faults.HopFault` with
its failure class, as for any hop: never shown to the model, never verified into a reward.

Each HTTP server gets one MCP session per rollout (opened when the rollout starts, closed when
it ends); a stdio server is one process per agent process, shared by its rollouts and started
again after it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.agents.agent_hops import hop_timeout_s
from nemo_gym.agents.hop_faults import HopFault, status_failure_class
from nemo_gym.failure_classes import BAD_UPSTREAM_BODY, TIMEOUT, UNREACHABLE
from nemo_gym.serving.protocol import MCP_FAILURE_CLASS_META as FAILURE_CLASS_META
from nemo_gym.serving.protocol import MCP_METADATA_KEY, auth_headers

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

# The ``mcp`` package (and httpx under it) is imported where a rollout first uses an MCP server:
# an agent configured without ``mcp_servers`` never pays its ~0.5 s and ~17 MiB at start-up.

logger = logging.getLogger("nemo_gym")

# JSON-RPC errors a server answers about the request itself: for tools/call, the model's mistake
# (JSON-RPC 2.0's INVALID_PARAMS, METHOD_NOT_FOUND and INVALID_REQUEST, as in mcp.types).
_MODEL_MISTAKE_CODES = frozenset({-32602, -32601, -32600})


class MCPServerConfig(BaseModel):
    """One MCP server an agent may use: exactly one of ``url`` (streamable HTTP), ``command``
    (stdio) or ``from_seed_session`` (the resources server's own ``/mcp``, from the ``mcp`` key of
    its ``/seed_session`` answer).

    ``tools`` keeps only the named tools; ``namespace`` offers them as ``mcp__<server>__<tool>``
    (needed when two servers have a tool of the same name).
    """

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    from_seed_session: bool = False
    namespace: bool = False
    tools: list[str] | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        chosen = [k for k in ("url", "command", "from_seed_session") if getattr(self, k)]
        if len(chosen) != 1:
            raise ValueError(
                "an MCP server needs exactly one of url (streamable HTTP), command (stdio) or "
                f"from_seed_session: true; got {chosen or 'none'}"
            )
        return self


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _cause(exc: BaseException) -> BaseException | None:
    """What went wrong, out of the exception groups the SDK's task groups wrap it in; None when
    it was only a cancellation (a deadline or a caller that left: not ours to convert)."""
    leaves = list(_leaves(exc))
    for leaf in leaves:
        if isinstance(leaf, HopFault):
            return leaf
    return next((leaf for leaf in leaves if not isinstance(leaf, asyncio.CancelledError)), None)


def _unwrap(exc: BaseException) -> BaseException:
    return _cause(exc) or exc


def classify(exc: BaseException, server: str, what: str) -> HopFault:
    """The :class:`HopFault` for a failed MCP exchange with ``server`` (``what``: the method)."""
    import httpx
    from mcp import McpError

    exc = _unwrap(exc)
    path = f" (MCP {what})"
    if isinstance(exc, HopFault):
        return exc
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        cls = status_failure_class(status) or BAD_UPSTREAM_BODY
        return HopFault(cls, server, path, f"HTTP {status} from the MCP endpoint {exc.request.url}", status)
    if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
        return HopFault(TIMEOUT, server, path, "no answer from the MCP server within the hop deadline")
    if isinstance(exc, (httpx.TransportError, OSError, EOFError)):
        return HopFault(
            UNREACHABLE, server, path, f"cannot reach the MCP server: {type(exc).__name__}: {exc}"
        )
    if isinstance(exc, McpError):
        if exc.error.code == httpx.codes.REQUEST_TIMEOUT:
            return HopFault(TIMEOUT, server, path, f"no answer from the MCP server: {exc.error.message}")
        if exc.error.code in _MODEL_MISTAKE_CODES:
            return HopFault(
                BAD_UPSTREAM_BODY, server, path, f"the MCP server refused {what}: {exc.error.message}"
            )
        return HopFault(UNREACHABLE, server, path, f"the MCP session failed: {exc.error.message}")
    return HopFault(BAD_UPSTREAM_BODY, server, path, f"{type(exc).__name__}: {exc}")


def result_text(result: CallToolResult) -> str:
    """A tool result as the text the model reads: its text parts, other parts as JSON."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json")))
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent))
    return "\n".join(parts)


class _StdioProcess:
    """One stdio MCP server process and its session, owned by a task of their own."""

    def __init__(self, name: str, config: MCPServerConfig) -> None:
        self.name = name
        self.config = config
        self._session: ClientSession | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def session(self, timeout_s: float) -> ClientSession:
        async with self._lock:
            if self._session is None or self._owner is None or self._owner.done():
                ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
                self._stop = asyncio.Event()
                self._owner = asyncio.create_task(self._own(ready))
                try:
                    async with asyncio.timeout(timeout_s):
                        self._session = await asyncio.shield(ready)
                except BaseException as exc:
                    self._stop.set()
                    cause = _cause(exc)
                    if cause is None:
                        raise
                    raise classify(cause, self.name, "initialize") from cause
            return self._session

    async def _own(self, ready: asyncio.Future[ClientSession]) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=self.config.command or "", args=self.config.args, env=self.config.env, cwd=self.config.cwd
        )
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            if not ready.done():
                ready.set_exception(_unwrap(exc))
        finally:
            self._session = None

    async def close(self) -> None:
        self._stop.set()
        if self._owner is not None:
            await asyncio.gather(self._owner, return_exceptions=True)


class MCPToolbox:
    """The MCP tools of one rollout: what to offer the model, and how to call each one.

    Open it with :meth:`open` for the rollout's whole life.
    """

    def __init__(self) -> None:
        self._routes: dict[str, tuple[str, str, ClientSession]] = {}  # offered name -> server, tool, session
        self._tools: list[dict[str, Any]] = []
        self.timeout_s = hop_timeout_s()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        servers: dict[str, MCPServerConfig],
        *,
        stdio: dict[str, _StdioProcess],
        seed_answer: Any = None,
        resources_url: str | None = None,
        timeout_s: float | None = None,
        taken: set[str] | frozenset[str] = frozenset(),
    ) -> AsyncIterator[MCPToolbox]:
        """Connect to each server (``stdio`` holds the agent's shared processes), list its tools.

        ``seed_answer`` and ``resources_url`` serve ``from_seed_session`` entries (skipped when
        the seed answer has no ``mcp`` key); ``taken`` holds tool names already offered.
        """
        box = cls()
        box.timeout_s = timeout_s or box.timeout_s
        phase, current = "setup", ""
        try:
            async with contextlib.AsyncExitStack() as stack:
                for current, config in servers.items():
                    if config.command:
                        process = stdio.setdefault(current, _StdioProcess(current, config))
                        session = await process.session(box.timeout_s)
                    else:
                        url, headers = config.url, dict(config.headers)
                        if config.from_seed_session:
                            meta = (
                                seed_answer.get(MCP_METADATA_KEY) if isinstance(seed_answer, dict) else None
                            )
                            if not isinstance(meta, dict) or resources_url is None:
                                continue
                            path = str(meta.get("url_path") or "/mcp").lstrip("/")
                            url = f"{resources_url.rstrip('/')}/{path}"
                            headers = {**auth_headers(), **headers, **(meta.get("headers") or {})}
                        assert url is not None
                        session = await box._connect(stack, url, headers)
                    await box._add_tools(current, config, session, taken)
                phase = "body"
                yield box
                phase = "closing"
        except BaseException as exc:
            cause = _cause(exc)
            if phase == "closing" and isinstance(cause, Exception):
                # The rollout is done; a server that fails while its session is being closed
                # (gone already, refuses the DELETE) costs nothing.
                logger.warning("closing MCP sessions: %s: %s", type(cause).__name__, cause)
                return
            if cause is None or cause is exc and phase == "body":
                raise
            if phase == "body" or isinstance(cause, HopFault):
                raise cause from None
            raise classify(cause, current, "initialize") from cause

    async def _connect(
        self, stack: contextlib.AsyncExitStack, url: str, headers: dict[str, str]
    ) -> ClientSession:
        import httpx
        from mcp import ClientSession
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        client = await stack.enter_async_context(
            create_mcp_http_client(headers=headers, timeout=httpx.Timeout(self.timeout_s))
        )
        read, write, *_ = await stack.enter_async_context(streamable_http_client(url, http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write))
        async with asyncio.timeout(self.timeout_s):
            await session.initialize()
        return session

    async def _add_tools(
        self, name: str, config: MCPServerConfig, session: ClientSession, taken: set[str] | frozenset[str]
    ) -> None:
        tools: list[Tool] = (await self._exchange(name, "tools/list", session.list_tools())).tools
        for tool in tools:
            if config.tools is not None and tool.name not in config.tools:
                continue
            offered = f"mcp__{name}__{tool.name}" if config.namespace else tool.name
            if offered in self._routes or offered in taken:
                owner = self._routes[offered][0] if offered in self._routes else "the row's own tools"
                raise ValueError(
                    f"MCP server {name!r} has a tool {tool.name!r}, a name {owner!r} already offers; "
                    f"set namespace: true on {name!r} to offer it as mcp__{name}__{tool.name}"
                )
            self._routes[offered] = (name, tool.name, session)
            self._tools.append(
                {
                    "type": "function",
                    "name": offered,
                    "description": tool.description or "",
                    "parameters": tool.inputSchema or {"type": "object", "properties": {}},
                    "strict": False,
                }
            )

    async def _exchange(self, name: str, what: str, awaitable: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await awaitable
        except BaseException as exc:
            cause = _cause(exc)
            if cause is None:
                raise  # cancelled from outside (the rollout's deadline, a caller that left)
            raise classify(cause, name, what) from cause

    def function_tools(self) -> list[dict[str, Any]]:
        """The tools to offer the model (Responses API function tools)."""
        return list(self._tools)

    def owns(self, name: str) -> bool:
        """Whether a function call of this name goes to an MCP server."""
        return name in self._routes

    async def call(self, name: str, arguments_json: str | None) -> str:
        """Run one function call on its MCP server; the text the model reads as its output.

        The tool's own errors come back as text; a fault of the server raises :class:`HopFault`.
        """
        server, tool, session = self._routes[name]
        try:
            arguments = json.loads(arguments_json or "{}")
        except json.JSONDecodeError as exc:
            return f"Error: the arguments of {name!r} are not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name!r} must be a JSON object"
        try:
            result = await self._exchange(server, "tools/call", session.call_tool(tool, arguments))
        except HopFault as fault:
            from mcp import McpError

            refusal = fault.__cause__
            if isinstance(refusal, McpError) and refusal.error.code in _MODEL_MISTAKE_CODES:
                # The server refused the call itself (no such tool, bad params): the model's mistake.
                return f"Error: tool {name!r} failed: {refusal.error.message}"
            raise
        meta = result.meta or {}
        failure_class = meta.get(FAILURE_CLASS_META)
        if result.isError and isinstance(failure_class, str):
            # One of our resources servers: its route answered an infrastructure fault (a 5xx, an
            # upstream timeout), classified as the same call over HTTP would be.
            raise HopFault(failure_class, server, f" (MCP tools/call {tool})", result_text(result))
        text = result_text(result)
        return f"Error: tool {name!r} failed: {text}" if result.isError else text


async def close_stdio(processes: dict[str, _StdioProcess]) -> None:
    """Stop an agent's stdio MCP server processes."""
    for process in processes.values():
        await process.close()
