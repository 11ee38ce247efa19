"""ServerClient against real loopback servers: retries, deadlines, errors, replica affinity, cookies."""

import asyncio
import time

import pytest

from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer, tool
from nemo_gym.launch.launcher import free_port
from nemo_gym.serving.server_client import ServerCallError, ServerClient
from nemo_gym.testing import running_aiohttp_app, running_server, serving_aiohttp_app


class Probe(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    @tool
    async def whoami(self, body: dict) -> dict:
        self.session["calls"] = self.session.get("calls", 0) + 1
        return {"server": self.name, "calls": self.session["calls"]}

    @tool
    async def slow(self, body: dict) -> dict:
        await asyncio.sleep(float(body.get("seconds", 5)))
        return {}

    @tool
    async def fail(self, body: dict) -> dict:
        raise ValueError("bad input")


async def test_unreachable_is_classified_after_bounded_retries():
    client = ServerClient(static_urls={"ghost": f"http://127.0.0.1:{free_port()}"}, connect_retries=2)
    started = time.monotonic()
    with pytest.raises(ServerCallError) as info:
        await client.post("ghost", "/anything", {})
    assert info.value.kind == "unreachable" and "3 attempts" in str(info.value)
    assert time.monotonic() - started < 5
    # Plain HTTP: no "ssl:default" (aiohttp's wording), the port and the reason instead.
    assert "ssl" not in str(info.value) and "connection refused" in str(info.value)
    await client.close()


async def test_connection_errors_name_host_port_and_reason_for_plain_http():
    from nemo_gym.serving.upstream import UpstreamHTTP

    port = free_port()
    client = UpstreamHTTP(connect_retries=0, connect_timeout_s=2, request_timeout_s=5)
    try:
        with pytest.raises(Exception) as info:
            await client.request("POST", f"http://127.0.0.1:{port}/v1/responses", {})
    finally:
        await client.close()
    assert f"cannot connect to 127.0.0.1:{port}: connection refused" in str(info.value)
    assert "ssl" not in str(info.value)


def test_deadline_and_http_error_and_cookies_per_rollout():
    with running_server(Probe({"name": "probe"})) as url:

        async def main():
            client = ServerClient(static_urls={"probe": url})
            with pytest.raises(ServerCallError) as info:
                await client.post("probe", "/slow", {"seconds": 1}, timeout_s=0.3)
            assert info.value.kind == "timeout"
            with pytest.raises(ServerCallError) as info:
                await client.post_json("probe", "/fail", {})
            assert (
                info.value.kind == "http_error"
                and info.value.status == 500
                and "bad input" in str(info.value)
            )
            one, two = client.rollout(), client.rollout()
            assert (await one.post_json("probe", "/whoami", {}))["calls"] == 1
            assert (await one.post_json("probe", "/whoami", {}))["calls"] == 2  # same session via cookie jar
            assert (await two.post_json("probe", "/whoami", {}))["calls"] == 1  # its own session
            assert one.session_id("probe") != two.session_id("probe")
            await client.close()

        asyncio.run(main())


def test_rollout_sticks_to_one_replica():
    with (
        running_server(Probe({"name": "replica_a"})) as url_a,
        running_server(Probe({"name": "replica_b"})) as url_b,
    ):

        async def main():
            client = ServerClient(static_urls={"probe": [url_a, url_b]})
            seen_per_rollout = []
            for _ in range(12):
                rollout = client.rollout()
                seen_per_rollout.append(
                    {(await rollout.post_json("probe", "/whoami", {}))["server"] for _ in range(4)}
                )
            await client.close()
            return seen_per_rollout

        seen = asyncio.run(main())
        assert all(len(s) == 1 for s in seen)  # every rollout stayed on one replica
        assert set().union(*seen) == {"replica_a", "replica_b"}  # and both replicas were used


def test_one_client_serves_several_event_loops_at_once():
    """verifiers-style use: rollouts on different threads/loops share a client, never a loop-bound session."""
    import threading

    with running_server(Probe({"name": "probe"})) as url:
        client = ServerClient(static_urls={"probe": url})
        results: list[int] = []
        errors: list[BaseException] = []

        def worker() -> None:
            async def main() -> None:
                rollout = client.rollout()
                for _ in range(5):
                    results.append((await rollout.post_json("probe", "/whoami", {}))["calls"])
                await client.close()

            try:
                asyncio.run(main())
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert sorted(results) == sorted([1, 2, 3, 4, 5] * 4)


async def test_a_burst_of_first_calls_shares_one_head_lookup():
    from aiohttp import web

    lookups = []

    async def instances(request: web.Request) -> web.Response:
        lookups.append(1)
        await asyncio.sleep(0.1)  # the whole burst arrives while the lookup is in flight
        return web.json_response(
            [{"name": "env", "url": "http://127.0.0.1:9", "host": "127.0.0.1", "port": 9}]
        )

    app = web.Application()
    app.router.add_get("/server_instances", instances)
    async with serving_aiohttp_app(app) as url:
        client = ServerClient(url)
        try:
            urls = await asyncio.gather(*(client.base_url("env") for _ in range(50)))
            assert set(urls) == {"http://127.0.0.1:9"} and len(lookups) == 1
            with pytest.raises(ServerCallError) as info:
                await client.resolve("nope", refresh=True)
            assert info.value.kind == "not_found" and len(lookups) == 2
        finally:
            await client.close()


def test_a_rollout_finds_a_server_restarted_on_another_port_through_the_head_server():
    from aiohttp import web

    lookups = []
    with running_server(Probe({"name": "probe"})) as live:
        listed = [f"http://127.0.0.1:{free_port()}", live]  # where it was (nothing there now), where it is

        async def instances(request: web.Request) -> web.Response:
            url = listed[min(len(lookups), 1)]
            lookups.append(url)
            port = int(url.rsplit(":", 1)[1])
            return web.json_response([{"name": "probe", "url": url, "host": "127.0.0.1", "port": port}])

        app = web.Application()
        app.router.add_get("/server_instances", instances)
        with running_aiohttp_app(app) as head:

            async def call() -> dict:
                client = ServerClient(head, connect_retries=1)
                try:
                    resp = await client.rollout("r1").post("probe", "/whoami", {})
                    assert resp.status == 200
                    return resp.json()
                finally:
                    await client.close()

            # The first address refuses (no request reached anything): the name is looked up
            # again once and the call goes to where the server is now.
            assert asyncio.run(call()) == {"server": "probe", "calls": 1}
            assert lookups == listed


def test_a_rollout_calls_a_request_its_client_overrides_and_keeps_the_session():
    seen = []

    class Recording(ServerClient):
        async def request(self, method, server_name, url_path, json=None, **kwargs):
            seen.append((method, url_path, sorted(kwargs)))
            return await super().request(method, server_name, url_path, json, **kwargs)

    with running_server(Probe({"name": "probe"})) as url:

        async def calls() -> list[dict]:
            client = Recording(static_urls={"probe": url})
            try:
                rollout = client.rollout("r1")
                first = await rollout.post("probe", "/whoami", {}, timeout_s=10)
                second = await rollout.post("probe", "/whoami", {})
                return [first.json(), second.json()]
            finally:
                await client.close()

        answers = asyncio.run(calls())
    assert [a["calls"] for a in answers] == [1, 2]  # the session cookie of the first call was sent again
    keywords = ["cookies", "replica", "rollout_id", "token_capture"]
    assert seen == [("POST", "/whoami", sorted([*keywords, "timeout_s"])), ("POST", "/whoami", keywords)]
