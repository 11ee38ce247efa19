"""``nemo_gym.sandbox.AsyncSandboxCompose`` on the real ``local`` provider: services started in
dependency order, health checks, a one-shot job that must succeed, URLs rewritten to service
addresses, and everything refused that the file asks for but cannot be honoured."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.sandbox import AsyncSandboxCompose
from nemo_gym.sandbox.compose import compose_duration_s
from nemo_gym.sandbox.providers import SandboxHandle
from nemo_gym.sandbox.providers.local import LocalProvider


class NetworkedLocal(LocalProvider):
    """The local provider with the network capability Compose needs: every sandbox is on this
    machine, so each service's address is the loopback address; the host tables are recorded."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hosts: dict[str, dict[str, str]] = {}

    def validate_networking(self) -> None:
        return None

    async def network_address(self, handle: SandboxHandle) -> str:
        return "127.0.0.1"

    async def set_hosts(self, handle: SandboxHandle, hosts: Mapping[str, str]) -> None:
        self.hosts[handle.sandbox_id] = dict(hosts)


def _write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


FAST = {"interval": "100ms", "timeout": "5s", "retries": 30, "start_interval": "100ms"}


async def test_services_start_in_order_with_health_and_completion(tmp_path: Path) -> None:
    document = {
        "services": {
            "app": {
                "image": "app:1",
                "command": ["sh", "-c", 'echo "$DB_URL" > url.txt; sleep 60'],
                "working_dir": "/srv",
                "environment": {"DB_URL": "postgres://u:p@db:5432/x"},
                "depends_on": {"migrate": {"condition": "service_completed_successfully"}},
                "x-sandbox": {"resolve_environment": ["DB_URL"]},
            },
            "migrate": {
                "image": "app:1",
                "entrypoint": "sh -c",
                "command": ["test -f /tmp/db_seen || echo migrated"],
                "depends_on": {"db": {"condition": "service_healthy"}},
            },
            "db": {
                "image": "db:1",
                "command": ["sh", "-c", "sleep 0.3; touch /tmp/ready; sleep 60"],
                "healthcheck": {"test": ["CMD-SHELL", "test -f /tmp/ready"], **FAST},
                "networks": {"default": {"aliases": ["database"]}},
                "labels": {"role": "db"},
            },
        }
    }
    provider = NetworkedLocal(default_timeout_s=60)
    compose = AsyncSandboxCompose(provider, _write(tmp_path, document), timeout_s=60, poll_interval_s=0.05)
    started = time.monotonic()
    async with compose:
        assert list(compose.services) == ["db", "migrate", "app"]  # dependency order
        db = compose.services["db"]
        assert (await db.exec("test -f /tmp/ready")).return_code == 0
        runtime = f"/tmp/{compose.project}"
        migrate = compose.services["migrate"]
        assert (
            await migrate.exec(f"cat {runtime}/migrate/exit; cat {runtime}/migrate/log")
        ).stdout == "0migrated\n"
        app = compose.services["app"]
        for _ in range(100):
            url = await app.exec("cat url.txt 2>/dev/null")
            if url.stdout:
                break
        assert url.stdout == "postgres://u:p@127.0.0.1:5432/x\n"  # the service name became its address
        tables = list(provider.hosts.values())
        assert tables and all(
            t == {"app": "127.0.0.1", "migrate": "127.0.0.1", "db": "127.0.0.1", "database": "127.0.0.1"}
            for t in tables
        )
        assert (
            db._spec.metadata["role"] == "db"
            and db._spec.metadata["nemo_gym.compose.project"] == compose.project
        )
    assert time.monotonic() - started < 30
    assert all(box._closed for box in compose.services.values())


async def test_a_failing_dependency_stops_everything(tmp_path: Path) -> None:
    document = {
        "services": {
            "job": {"image": "x", "command": ["sh", "-c", "echo broken >&2; exit 4"]},
            "web": {
                "image": "x",
                "command": ["sleep", "60"],
                "depends_on": {"job": {"condition": "service_completed_successfully"}},
            },
        }
    }
    compose = AsyncSandboxCompose(
        NetworkedLocal(default_timeout_s=60), _write(tmp_path, document), poll_interval_s=0.05
    )
    with pytest.raises(RuntimeError, match=r"'job' exited with status 4: broken"):
        await compose.start()
    # Every sandbox starts first, then commands in order: web's command never ran, all are stopped.
    web = compose._plans["web"].runtime
    assert "web" not in compose._commands and web.endswith("/web")
    assert all(box._closed for box in compose.services.values())


async def test_an_unhealthy_service_fails_after_its_retries(tmp_path: Path) -> None:
    document = {
        "services": {
            "svc": {
                "image": "x",
                "command": ["sleep", "60"],
                "healthcheck": {"test": ["CMD", "false"], "interval": "50ms", "retries": 2},
            }
        }
    }
    # One service needs no network capability: the plain local provider will do.
    compose = AsyncSandboxCompose(
        {"local": {"default_timeout_s": 60}}, _write(tmp_path, document), poll_interval_s=0.05
    )
    with pytest.raises(RuntimeError, match="'svc' is unhealthy after 2 checks"):
        await compose.start()
    assert compose.services["svc"]._closed


@pytest.mark.parametrize(
    ("document", "error", "message"),
    [
        ({"services": {"a": {"image": "x", "command": "true", "restart": "always"}}}, NotImplementedError, "restart"),
        ({"services": {"a": {"image": "x", "command": "true", "volumes": [{"type": "volume"}]}}}, NotImplementedError, "volumes"),
        ({"services": {"a": {"command": "true"}}}, ValueError, "prebuilt 'image'"),
        ({"services": {"a": {"image": "x", "command": "true", "depends_on": {"b": {}}}}}, ValueError, "unknown service 'b'"),
        ({"services": {"a": {"image": "x", "command": "true", "build": "."}}}, NotImplementedError, r"unsupported fields \['build'\]"),
        ({"services": {"a": {"image": "x", "ports": [{"target": 80, "published": 8080}]}}}, NotImplementedError, "published ports"),
        ({"services": {"a": {"image": "x"}}}, ValueError, "neither entrypoint nor command"),
        (
            {"services": {"a": {"image": "x", "command": "true", "depends_on": {"b": {}}}, "b": {"image": "x", "command": "true", "depends_on": {"a": {}}}}},
            ValueError,
            "cycle",
        ),
        ({"services": {"a": {"image": "x", "command": "true"}, "b": {"image": "x", "command": "true"}}}, NotImplementedError, "cannot connect sandboxes"),
        ({"services": {"a": {"image": "x", "command": "true"}}, "networks": {"backend": {}}}, NotImplementedError, "custom networks"),
    ],
)  # fmt: skip
async def test_what_cannot_be_honoured_is_refused_before_anything_starts(
    tmp_path: Path, document: dict[str, Any], error: type[Exception], message: str
) -> None:
    provider = LocalProvider()
    compose = AsyncSandboxCompose(provider, _write(tmp_path, document))
    with pytest.raises(error, match=message):
        await compose.start()
    assert compose.services == {}


def test_compose_durations() -> None:
    assert (
        compose_duration_s("1m30s") == 90
        and compose_duration_s("500ms") == 0.5
        and compose_duration_s(2) == 2.0
    )
    with pytest.raises(ValueError, match="not a Compose duration"):
        compose_duration_s("5 minutes")
