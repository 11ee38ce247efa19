"""Blocking HTTP calls for test code: exact-header requests and a JSON client with cookie jars."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from nemo_gym.serving.protocol import auth_headers


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
