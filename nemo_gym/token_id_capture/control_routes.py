"""The bearer-protected manifest route of worker-owned staging, and the trainer's client for it.

``GET /training-token-capture/control/rollouts/<id>/manifest`` answers the rollout's token-free
manifest; the token is read from the environment (``control_auth_token_env``), never the config.
"""

from __future__ import annotations

import hmac
from typing import Any

from nemo_gym.token_id_capture.protocols import CaptureLedger
from nemo_gym.token_id_capture.staging.records import RolloutManifest

CONTROL_ROUTE_PREFIX = "/training-token-capture/control"


def install_rollout_control_routes(app: Any, lineage_store: CaptureLedger, *, auth_token: str) -> None:
    """Add the manifest route to a FastAPI app (401 without the bearer token, 400 for a bad id)."""
    from fastapi import APIRouter, Header, HTTPException

    if not auth_token:
        raise ValueError("the rollout control route needs a non-empty auth token")
    expected = f"Bearer {auth_token}"
    router = APIRouter(prefix=CONTROL_ROUTE_PREFIX)

    async def rollout_manifest(
        rollout_id: str, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:  # noqa: B008
        if authorization is None or not hmac.compare_digest(authorization, expected):
            raise HTTPException(status_code=401, detail="missing or invalid control-plane bearer token")
        try:
            return await lineage_store.manifest(rollout_id)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc

    rollout_manifest.__annotations__ = {
        "rollout_id": str,
        "authorization": str | None,
        "return": dict[str, Any],
    }
    router.get("/rollouts/{rollout_id}/manifest")(rollout_manifest)
    app.include_router(router)


class RolloutControlClient:
    """A trainer's client of the manifest route (one deadline per request)."""

    def __init__(self, base_url: str, *, auth_token: str, request_timeout_s: float) -> None:
        if not auth_token or request_timeout_s <= 0:
            raise ValueError("the control client needs an auth token and a positive timeout")
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {auth_token}"}
        self._timeout = request_timeout_s

    async def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest (``RuntimeError`` naming the status otherwise)."""
        import aiohttp

        url = f"{self._base_url}{CONTROL_ROUTE_PREFIX}/rollouts/{rollout_id}/manifest"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout)) as session:
                async with session.get(url, headers=self._headers) as response:
                    if response.status != 200:
                        raise RuntimeError(
                            f"manifest of rollout {rollout_id}: HTTP {response.status} {await response.text()}"
                        )
                    return RolloutManifest.model_validate(await response.json())
        except TimeoutError as exc:
            raise RuntimeError(f"manifest of rollout {rollout_id} took longer than {self._timeout}s") from exc
