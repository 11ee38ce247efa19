"""Compatibility: NeMo Gym's verifier fixtures (``nemo_gym.verifier_fixture``): an environment's scorer checked
against cases it ships, without starting a server.

A fixture file is JSONL, one case per line: ``name``, ``kind`` (``full_reward``,
``zero_reward``, ``malformed`` or ``determinism``), the verify ``request`` and either
``expected_reward`` (every kind but malformed) or ``expected_error`` (a text the malformed
case's error must contain). :func:`exercise_verifier_fixture` builds a fresh server per case,
validates the request with the fixture's request model, calls ``verify`` (or the fixture's
``invoke``) and checks the reward: the full and zero cases must hit the ends of
``reward_range``, every reward must lie inside it, a ``seeded`` scorer's determinism case must
give the same reward twice on fresh servers. ``update_expected=True`` rewrites the expected
rewards from what was observed.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CaseKind = Literal["full_reward", "zero_reward", "malformed", "determinism"]
Invocation = Callable[[Any, BaseModel], Any]
FiniteReward = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class VerifierFixtureError(ValueError):
    """The fixture is malformed, or the verifier does not behave as it says."""


@dataclass(frozen=True)
class VerifierFixture:
    """How to exercise one scorer: a factory for a fresh server, the request model, the cases
    file; optionally ``invoke(server, request)`` instead of ``server.verify(request)`` and
    ``reseed(server, request)`` run before a determinism case."""

    server_factory: Callable[[], Any]
    request_model: type[BaseModel]
    cases_path: str | Path
    invoke: Invocation | None = None
    reseed: Invocation | None = None


class VerifierFixtureCase(BaseModel):
    """One line of a fixture file."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(min_length=1)
    kind: CaseKind
    request: dict[str, Any]
    expected_reward: FiniteReward | None = None
    expected_error: str | None = None

    @model_validator(mode="after")
    def _one_expectation(self) -> Self:
        if self.kind == "malformed" and (not self.expected_error or self.expected_reward is not None):
            raise ValueError("a malformed case needs expected_error and no expected_reward")
        if self.kind != "malformed" and (self.expected_reward is None or self.expected_error is not None):
            raise ValueError(f"a {self.kind} case needs expected_reward and no expected_error")
        return self


@dataclass(frozen=True)
class VerifierFixtureResult:
    """What one case observed (two rewards for a determinism case, none for a malformed one)."""

    name: str
    kind: CaseKind
    observed_rewards: tuple[float, ...] = ()


def load_verifier_fixture(path: str | Path) -> list[VerifierFixtureCase]:
    """The cases of a fixture file; :class:`VerifierFixtureError` names the file and line of a bad one."""
    source = Path(path)
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeError) as exc:
        raise VerifierFixtureError(f"cannot read verifier fixture {str(source)!r}: {exc}") from exc
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            cases.append(VerifierFixtureCase.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise VerifierFixtureError(f"{source}: line {number} is not JSON: {exc.msg}") from exc
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
            raise VerifierFixtureError(f"{source}: line {number}: {first['msg']}") from exc
    if not cases:
        raise VerifierFixtureError(f"verifier fixture {str(source)!r} has no cases")
    return cases


def _reward_of(result: Any, case: VerifierFixtureCase) -> float:
    reward = result.get("reward") if isinstance(result, Mapping) else getattr(result, "reward", result)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise VerifierFixtureError(f"case {case.name!r} gave no finite numeric reward: {reward!r}")
    return float(reward)


async def _run_case(fixture: VerifierFixture, case: VerifierFixtureCase, *, reseed: bool = False) -> Any:
    """One call on a fresh server; exceptions of the verifier itself propagate."""
    try:
        server = fixture.server_factory()
    except Exception as exc:
        raise VerifierFixtureError(f"case {case.name!r}: the server factory failed: {exc}") from exc
    request = fixture.request_model.model_validate(case.request)
    if reseed:
        if fixture.reseed is None:
            raise VerifierFixtureError("a determinism case of a seeded scorer needs the fixture's reseed")
        seeded = fixture.reseed(server, request)
        if inspect.isawaitable(seeded):
            await seeded
    if fixture.invoke is not None:
        result = fixture.invoke(server, request)
    elif callable(getattr(server, "verify", None)):
        result = server.verify(request)
    else:
        raise VerifierFixtureError("the server factory built an object without a verify method")
    return await result if inspect.isawaitable(result) else result


async def _observe(fixture: VerifierFixture, case: VerifierFixtureCase, *, reseed: bool = False) -> float:
    try:
        result = await _run_case(fixture, case, reseed=reseed)
    except VerifierFixtureError:
        raise
    except Exception as exc:
        raise VerifierFixtureError(f"case {case.name!r} failed: {exc}") from exc
    return _reward_of(result, case)


def _check(observed: float, expected: float, what: str) -> None:
    if observed != expected:
        raise VerifierFixtureError(f"{what}: expected {expected}, observed {observed}")


def _rewrite(path: Path, cases: list[VerifierFixtureCase]) -> None:
    """Replace the fixture file atomically (a symlink or special file is refused)."""
    if path.is_symlink() or not path.is_file():
        raise VerifierFixtureError(f"refusing to rewrite {str(path)!r}: not a regular file")
    text = "".join(
        json.dumps(c.model_dump(mode="json", exclude_none=True), sort_keys=True) + "\n" for c in cases
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _bounds(reward_range: Sequence[float]) -> tuple[float, float]:
    if len(reward_range) != 2:
        raise VerifierFixtureError("reward_range must hold exactly two numbers")
    lower, upper = reward_range
    if any(
        isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) for v in (lower, upper)
    ):
        raise VerifierFixtureError("reward_range must hold two finite numbers")
    if lower > upper:
        raise VerifierFixtureError("reward_range must be (lower, upper) with lower <= upper")
    return float(lower), float(upper)


async def exercise_verifier_fixture(
    fixture: VerifierFixture,
    *,
    reward_range: Sequence[float],
    higher_is_better: bool = True,
    determinism: str | Enum,
    update_expected: bool = False,
) -> tuple[VerifierFixtureResult, ...]:
    """Run every case of ``fixture`` (see the module docstring); one result per case run.

    ``determinism`` is ``seeded`` (a determinism case is required and run twice),
    ``stochastic`` or ``unknown`` (determinism cases are skipped). Raises
    :class:`VerifierFixtureError` at the first case that does not hold.
    """
    path = Path(fixture.cases_path)
    cases = load_verifier_fixture(path)
    lower, upper = _bounds(reward_range)
    if not isinstance(higher_is_better, bool):
        raise VerifierFixtureError("higher_is_better must be True or False")
    best, worst = (upper, lower) if higher_is_better else (lower, upper)
    mode = str(getattr(determinism, "value", determinism))
    if mode not in ("seeded", "stochastic", "unknown"):
        raise VerifierFixtureError(f"determinism must be seeded, stochastic or unknown, got {mode!r}")
    needed = {"full_reward", "zero_reward", "malformed"} | ({"determinism"} if mode == "seeded" else set())
    missing = sorted(needed - {case.kind for case in cases})
    if missing:
        raise VerifierFixtureError(f"verifier fixture {str(path)!r} lacks case kinds: {', '.join(missing)}")

    results: list[VerifierFixtureResult] = []
    observed_rewards: dict[int, float] = {}
    for index, case in enumerate(cases):
        if case.kind == "determinism" and mode != "seeded":
            continue
        if case.kind == "malformed":
            try:
                await _run_case(fixture, case)
            except VerifierFixtureError:
                raise
            except Exception as exc:
                if str(case.expected_error) not in str(exc):
                    raise VerifierFixtureError(
                        f"malformed case {case.name!r}: the error does not mention {case.expected_error!r}: {exc}"
                    ) from exc
            else:
                raise VerifierFixtureError(f"malformed case {case.name!r} raised no error")
            results.append(VerifierFixtureResult(case.name, case.kind))
            continue
        reward = await _observe(fixture, case, reseed=case.kind == "determinism")
        if not lower <= reward <= upper:
            raise VerifierFixtureError(f"case {case.name!r}: reward {reward} outside [{lower}, {upper}]")
        seen = [reward]
        if case.kind == "full_reward":
            _check(reward, best, f"full-reward case {case.name!r} must reach the best reward")
        elif case.kind == "zero_reward":
            _check(reward, worst, f"zero-reward case {case.name!r} must reach the worst reward")
        elif case.kind == "determinism":
            again = await _observe(fixture, case, reseed=True)
            seen.append(again)
            _check(again, reward, f"determinism case {case.name!r} changed on a fresh server")
        if update_expected:
            observed_rewards[index] = reward
        else:
            _check(reward, float(case.expected_reward or 0.0), f"case {case.name!r}: reward")
        results.append(VerifierFixtureResult(case.name, case.kind, tuple(seen)))

    if update_expected:
        updated = [
            case.model_copy(update={"expected_reward": observed_rewards[i]})
            if i in observed_rewards
            else case
            for i, case in enumerate(cases)
        ]
        if updated != cases:
            _rewrite(path, updated)
    return tuple(results)
