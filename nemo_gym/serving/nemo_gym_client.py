"""NeMo Gym's client shapes (``nemo_gym.server_utils``) over :class:`~nemo_gym.serving.server_client.ServerClient`.

NeMo Gym-style code calls ``server_client.post(server_name=..., url_path=..., json=...)`` and
reads an aiohttp-shaped answer; these classes give it that shape while the calls go through
this package's client (deadlines, bounded retries, replica stickiness, the lean hop client).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from nemo_gym.failure_classes import HTTP_ERROR, UNREACHABLE
from nemo_gym.serving.hop_client import HopDisconnected
from nemo_gym.serving.launched_config import launched_global_config, launched_global_config_dict_config
from nemo_gym.serving.protocol import ENV_HEAD_URL, auth_headers
from nemo_gym.serving.server_client import ServerCallError, ServerClient, ServerResponse


class HTTPStatusError(ServerCallError, aiohttp.ClientResponseError):  # type: ignore[misc]
    """A non-2xx answer, raised by NeMo Gym-style ``raise_for_status``.

    Both a :class:`ServerCallError` of kind ``http_error`` (so the server base classifies it)
    and an ``aiohttp.ClientResponseError`` (what NeMo Gym-style code catches), with the body
    in ``response_content``.
    """

    def __init__(self, server: str, path: str, status: int, content: bytes) -> None:
        try:
            body: Any = orjson.loads(content) if content else None
        except orjson.JSONDecodeError:
            body = content.decode(errors="replace")
        message = body.get("error", body) if isinstance(body, dict) else body
        ServerCallError.__init__(self, HTTP_ERROR, server, path, f"HTTP {status}: {message}", status, body)
        self.request_info = None  # type: ignore[assignment]
        self.history = ()
        self.code = status
        self.message = f"HTTP {status}"
        self.headers = None
        self.response_content = content

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "HTTP error"

    def __reduce__(self) -> Any:
        return (type(self), (self.server, self.path, self.status, self.response_content))


class ServerConnectionError(ServerCallError, aiohttp.ClientConnectionError):
    """No answer from a named server (kind ``unreachable``), raised by NeMo Gym-style calls as
    both our :class:`ServerCallError` and the ``aiohttp.ClientConnectionError`` NeMo Gym-style
    code catches to retry."""


class ServerClientPayloadError(ServerCallError, aiohttp.ClientPayloadError):
    """A named server's answer broke off in the middle of its body (kind ``unreachable``):
    also the ``aiohttp.ClientPayloadError`` aiohttp raises for it."""


def _aiohttp_shaped(exc: ServerCallError) -> ServerCallError:
    """``exc`` as the aiohttp error NeMo Gym's client would raise for the same failure (a broken
    answer, no connection); other failures (a timeout, no such server) are passed on as they are."""
    if exc.kind != UNREACHABLE:
        return exc
    cause = exc.__cause__
    broken = isinstance(cause, aiohttp.ClientPayloadError) or (
        isinstance(cause, HopDisconnected) and cause.received > 0
    )
    shaped = (ServerClientPayloadError if broken else ServerConnectionError)(
        exc.kind,
        exc.server,
        exc.path,
        str(exc).removeprefix(f"{exc.server}{exc.path}: "),
        exc.status,
        exc.body,
    )
    return shaped


class _BaseUrls(MutableMapping[str, str]):
    """``name -> base URL`` over a client's static ``name -> [URL]`` map (one replica each).

    A URL set here is a server the caller started itself, which never registered with a head
    server (a NeMo Gym test's plain FastAPI judge, or one of ours served as is): it is called as
    NeMo Gym's client calls it, with plain paths, never this package's ``/ng-rollout/<id>``
    prefix (``external``, as a registered external endpoint is).
    """

    def __init__(self, static: dict[str, list[str]], external: set[str]) -> None:
        self._static = static
        self._external = external

    def __getitem__(self, name: str) -> str:
        return self._static[name][0]

    def __setitem__(self, name: str, url: str) -> None:
        self._static[name] = [url.rstrip("/")]
        self._external.add(url.rstrip("/"))

    def __delitem__(self, name: str) -> None:
        for url in self._static.pop(name):
            self._external.discard(url)

    def __iter__(self) -> Iterator[str]:
        return iter(self._static)

    def __len__(self) -> int:
        return len(self._static)


class _Content:
    """``response.content`` of an answer already read: ``await content.read()``."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self, n: int = -1) -> bytes:
        return self._body


class ClientResponse:
    """A finished answer shaped like aiohttp's: ``status``, ``ok``, ``cookies``, ``await read()/json()/text()``."""

    def __init__(self, response: ServerResponse, server_name: str, url_path: str) -> None:
        self.status = response.status
        self.ok = response.ok
        self.cookies = response.cookies
        self.content = _Content(response.body)
        self.server_name = server_name
        self.url_path = url_path
        self._response = response

    async def read(self) -> bytes:
        """The raw body."""
        return self._response.body

    async def json(self, **_: Any) -> Any:
        """The body parsed as JSON."""
        return self._response.json()

    async def text(self, **_: Any) -> str:
        """The body as text."""
        return self._response.body.decode(errors="replace")

    def raise_for_status(self) -> None:
        """Raise :class:`HTTPStatusError` for a non-2xx answer."""
        if not self.ok:
            raise HTTPStatusError(self.server_name, self.url_path, self.status, self._response.body)


def _field(config: Any, name: str) -> Any:
    """``config.name``, else ``config[name]``: a pydantic or dataclass config, or a mapping (a
    falsy attribute such as port 0 is still the attribute)."""
    if hasattr(config, name):
        return getattr(config, name)
    return config[name]


@dataclass(frozen=True)
class HeadServerAddress:
    """Where the head server listens (what NeMo Gym's ``load_head_server_config`` answers)."""

    host: str
    port: int


class NeMoGymServerClient(ServerClient):
    """NeMo Gym's client: built from the head server's config and the global config.

    ``post``/``get`` take NeMo Gym's keywords (``server_name=``, ``url_path=``, ``json=`` a
    dict or pydantic model, ``cookies=``) and answer an aiohttp-shaped :class:`ClientResponse`.
    Calls go through this package's client: deadlines, bounded retries, replica stickiness.
    """

    def __init__(self, head_server_config: Any = None, global_config_dict: Any = None, **kwargs: Any) -> None:
        head_url = kwargs.pop("head_url", None)
        if head_url is None and head_server_config is not None:
            host, port = (_field(head_server_config, name) for name in ("host", "port"))
            head_url = f"http://{host}:{port}"
        super().__init__(head_url, **kwargs)
        self.head_server_config = head_server_config
        self._global_config_dict = global_config_dict

    @property
    def _server_base_urls(self) -> _BaseUrls:
        """NeMo Gym's per-name base-URL cache, which its tests fill to point a name at a server
        they started (``client._server_base_urls["judge"] = url``): here, this client's static URLs
        (called with plain paths, see :class:`_BaseUrls`)."""
        return _BaseUrls(self._static, self._external)

    @property
    def global_config_dict(self) -> Any:
        """The run's global config: the one given, else the one ``ng_run`` launched this process
        with (an OmegaConf ``DictConfig``, built on first access), else ``{}``."""
        if self._global_config_dict is not None:
            return self._global_config_dict
        launched = launched_global_config_dict_config()
        return launched if launched is not None else {}

    @global_config_dict.setter
    def global_config_dict(self, value: Any) -> None:
        self._global_config_dict = value

    def plain_global_config(self) -> Mapping[str, Any]:
        """The global config without building an OmegaConf one: what our own code reads, so a
        launched server's process never loads omegaconf unless its code asks for the config."""
        if self._global_config_dict is None:
            return launched_global_config() or {}
        config = self._global_config_dict
        return config if isinstance(config, Mapping) else {}

    @classmethod
    def model_construct(cls, _fields_set: Any = None, **values: Any) -> NeMoGymServerClient:
        """A client from its fields, unchecked (NeMo Gym's client is a pydantic model that tests
        build this way): ``head_server_config`` and ``global_config_dict``."""
        return cls(values.get("head_server_config"), values.get("global_config_dict"))

    @classmethod
    def from_env(cls) -> NeMoGymServerClient:
        """A client for the head server named by ``NEMO_GYM_HEAD_URL`` (set by ``ng_run``)."""
        return cls(head_url=os.environ.get(ENV_HEAD_URL))

    @classmethod
    def load_head_server_config(cls) -> HeadServerAddress:
        """The head server's ``host`` and ``port``: from ``$NEMO_GYM_HEAD_URL`` (set by
        ``ng_run`` for its servers), else 127.0.0.1:11000."""
        from urllib.parse import urlsplit

        url = urlsplit(os.environ.get(ENV_HEAD_URL) or "http://127.0.0.1:11000")
        return HeadServerAddress(host=url.hostname or "127.0.0.1", port=url.port or 80)

    @classmethod
    def load_from_global_config(cls, head_server_config: Any = None) -> NeMoGymServerClient:
        """A client whose ``global_config_dict`` is the head server's config, fetched now (an
        OmegaConf ``DictConfig``, each running instance's ``host`` and ``port`` where it listens).

        ``head_server_config`` has ``host`` and ``port`` (attributes or keys); by default the head
        server is ``$NEMO_GYM_HEAD_URL``, else 127.0.0.1:11000. Raises ``ValueError`` naming the URL
        when the head server cannot be read.
        """
        import urllib.request

        import yaml
        from omegaconf import OmegaConf

        if head_server_config is None:
            base = (os.environ.get(ENV_HEAD_URL) or "http://127.0.0.1:11000").rstrip("/")
        else:
            host = getattr(head_server_config, "host", None) or head_server_config["host"]
            port = getattr(head_server_config, "port", None) or head_server_config["port"]
            base = f"http://{host}:{port}"
        url = f"{base}/global_config_dict_yaml"
        request = urllib.request.Request(url, headers=auth_headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - an http URL built above
                text = answer.read().decode()
        except OSError as exc:
            raise ValueError(
                f"could not read the global config from the head server at {url}: {exc}"
            ) from exc
        config = OmegaConf.create(yaml.safe_load(text) or {})
        return cls(head_server_config=head_server_config, global_config_dict=config, head_url=base)

    def poll_for_status(self, server_name: str, *, timeout_seconds: float = 5) -> str:
        """Whether a configured server answers at all: ``success``, ``connection_error``,
        ``timeout`` or ``unknown_error`` (NeMo Gym's values; any HTTP answer counts as up).

        Blocking (NeMo Gym's adapters call it from ``setup_webserver`` while waiting for a peer).
        """
        import urllib.error
        import urllib.request

        block = self.global_config_dict[server_name]
        if server_name != "head_server":  # instance name -> kind -> implementation -> fields
            block = next(iter(next(iter(block.values())).values()))
        if "host" not in block or "port" not in block:
            # Our servers bind port 0: a peer's address is known once it registered with the
            # head server (NeMo Gym assigns ports up front). Not registered yet: not up yet.
            if not self._learn_address(server_name, block):
                return "connection_error"
        url = self._build_server_base_url(block) + "/"
        try:
            urllib.request.urlopen(
                urllib.request.Request(url, headers=auth_headers()), timeout=timeout_seconds
            )  # noqa: S310
        except urllib.error.HTTPError:
            return "success"  # an answer, whatever its status: the server is up
        except TimeoutError:
            return "timeout"
        except urllib.error.URLError as exc:
            return "timeout" if isinstance(exc.reason, TimeoutError) else "connection_error"
        except Exception:  # noqa: BLE001 - NeMo Gym's catch-all status
            return "unknown_error"
        return "success"

    def registered_base_url(self, server_name: str, *, timeout_seconds: float = 30) -> str:
        """``http://host:port`` where the head server says ``server_name`` listens (its first
        replica), looked up now, blocking: for a config block that carries no address, as a
        server started on port 0 has in the config it was launched with. Raises ``ValueError``
        naming the server and the head server when it is not registered or the head cannot be read.
        """
        import json
        import urllib.request

        if not self.head_url:
            raise ValueError(f"no head server to ask where {server_name!r} listens (set {ENV_HEAD_URL})")
        url = f"{self.head_url}/server_instances"
        try:
            request = urllib.request.Request(url, headers=auth_headers())
            with urllib.request.urlopen(request, timeout=timeout_seconds) as answer:  # noqa: S310 - http URL
                instances = json.loads(answer.read())
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"could not ask the head server at {url} where {server_name!r} listens: {exc}"
            ) from exc
        for instance in instances if isinstance(instances, list) else []:
            if isinstance(instance, Mapping) and instance.get("name") == server_name and instance.get("url"):
                return str(instance["url"]).rstrip("/")
        raise ValueError(
            f"no server named {server_name!r} is registered with the head server at {self.head_url}"
        )

    def _learn_address(self, server_name: str, block: Any) -> bool:
        """Copy where the head server says ``server_name`` listens into ``block`` (this client's
        config for it, ``host`` and ``port``); False when it is not registered yet."""
        from urllib.parse import urlsplit

        try:
            where = urlsplit(self.registered_base_url(server_name, timeout_seconds=10))
        except ValueError:
            return False
        block["host"], block["port"] = where.hostname, where.port
        return True

    def _build_server_base_url(self, server_config_dict: Any) -> str:
        """``http://host:port`` of one server instance's config block (attributes or keys)."""
        if isinstance(server_config_dict, Mapping):
            return f"http://{server_config_dict['host']}:{server_config_dict['port']}"
        return f"http://{server_config_dict.host}:{server_config_dict.port}"

    async def post(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """POST to a named server; an aiohttp-shaped :class:`ClientResponse`."""
        if hasattr(json, "model_dump"):
            json = json.model_dump(exclude_unset=True, mode="json")
        try:
            resp = await self.request("POST", server_name, url_path, json, **_client_kwargs(kwargs))
        except ServerCallError as exc:
            raise _aiohttp_shaped(exc) from exc.__cause__
        return ClientResponse(resp, server_name, url_path)

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> Any:  # type: ignore[override]
        """GET from a named server; an aiohttp-shaped :class:`ClientResponse`."""
        try:
            resp = await self.request("GET", server_name, url_path, None, **_client_kwargs(kwargs))
        except ServerCallError as exc:
            raise _aiohttp_shaped(exc) from exc.__cause__
        return ClientResponse(resp, server_name, url_path)


def _client_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    # aiohttp keywords NeMo Gym-style callers pass: the cookies are kept, a timeout becomes our
    # deadline, the rest (headers, params) are not used between our servers.
    out: dict[str, Any] = {}
    if kwargs.get("cookies"):
        out["cookies"] = {k: getattr(v, "value", v) for k, v in dict(kwargs["cookies"]).items()}
    timeout = kwargs.get("timeout")
    if isinstance(timeout, (int, float)):
        out["timeout_s"] = float(timeout)
    elif timeout is not None and getattr(timeout, "total", None):
        out["timeout_s"] = float(timeout.total)
    return out
