"""Verify calls for environment tests: one row at a time, NeMo Gym's recorded rollouts, parity cases."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.launch.config import project_root
from nemo_gym.testing.http_clients import SyncClient
from nemo_gym.testing.jsonl_rows import read_jsonl


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
