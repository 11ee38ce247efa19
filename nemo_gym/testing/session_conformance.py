"""NeMo Gym's session-contract check (``nemo_gym.testing.session_conformance``) for an
environment's ``/seed_session`` and ``/close_session``."""

from __future__ import annotations

from typing import Any

from nemo_gym.base_resources_server import (
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)


def check_resources_session_contract(
    app: Any, seed: ResourcesSeedSessionRequest, *, keeps_state: bool
) -> None:
    """Drive ``app`` (an ASGI app) through seed, repeated seed, close, repeated close and the
    close of a session never seeded; raise ``AssertionError`` naming the step that broke the
    contract.

    Seeding and closing are idempotent and answer with the same ``resources_session_id``;
    closing an unknown session succeeds. With ``keeps_state``, a seed arriving after its
    session closed (or after a close of a never-seeded id) must be refused (a 4xx/5xx), so a
    late retry cannot bring closed state back. ``seed`` must use an id the app has not seen.
    """
    from starlette.testclient import TestClient

    client = TestClient(app, raise_server_exceptions=False)
    session_id = seed.resources_session_id
    close = ResourcesCloseSessionRequest(resources_session_id=session_id, episode_id=seed.episode_id)

    steps = (
        ("seed", "/seed_session", seed, ResourcesSeedSessionResponse),
        ("repeated seed", "/seed_session", seed, ResourcesSeedSessionResponse),
        ("close", "/close_session", close, ResourcesCloseSessionResponse),
        ("repeated close", "/close_session", close, ResourcesCloseSessionResponse),
    )
    for step, path, body, answer_type in steps:
        answer = client.post(path, json=body.model_dump(mode="json"))
        assert answer.status_code == 200, f"{step}: HTTP {answer.status_code} {answer.text}"
        answered = answer_type.model_validate(answer.json())
        assert answered.resources_session_id == session_id, (
            f"{step} answered session {answered.resources_session_id!r}"
        )

    unknown = seed.model_copy(update={"resources_session_id": f"{session_id}-never-seeded"})
    answer = client.post(
        "/close_session",
        json=ResourcesCloseSessionRequest(
            resources_session_id=unknown.resources_session_id, episode_id=seed.episode_id
        ).model_dump(mode="json"),
    )
    assert answer.status_code == 200, f"close of a never-seeded session: HTTP {answer.status_code}"
    if keeps_state:
        for late in (seed, unknown):
            answer = client.post("/seed_session", json=late.model_dump(mode="json"))
            assert answer.status_code >= 400, (
                f"a seed after close brought session {late.resources_session_id!r} back (HTTP {answer.status_code})"
            )
