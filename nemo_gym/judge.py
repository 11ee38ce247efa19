"""Compatibility: NeMo Gym's LLM-judge call and its failure (``nemo_gym.judge``): a judge that cannot be asked is
a failed verification, never a wrong answer.

- :func:`call_judge` POSTs to a judge model server and parses its answer; any failure of the
  *call* (unreachable, timeout, HTTP error, a body that does not parse) is :class:`JudgeError`.
  A judge answer that parses but says nothing usable is the environment's to score.
- :func:`reraise_judge_errors` turns any exception of one awaited call into :class:`JudgeError`
  (wrap the call only, not the scoring around it, or ordinary bugs become judge failures).
- :func:`judge_failsafe` wraps a ``verify``: a :class:`JudgeError` becomes the verify answer
  NeMo Gym gives, the request's fields with ``reward: 0.0``, ``mask_sample: true`` and
  ``_ng_failure_class: "judge_failed"``. Our collector files such an answer as a failure row
  (``judge_failed``), never as a reward of 0, as it does our own :class:`~nemo_gym.llm_judge.JudgeFailedError`.

Our own environments use :mod:`nemo_gym.llm_judge` (verdict labels, a 502 ``judge_failed``
answer); both name the failure ``judge_failed``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.responses import JSONResponse

from nemo_gym.llm_judge import JUDGE_FAILED
from nemo_gym.server_utils import get_response_json

__all__ = ["JudgeError", "call_judge", "judge_failed_answer", "judge_failsafe", "reraise_judge_errors"]

ResponseT = TypeVar("ResponseT", bound=BaseModel)
FAILURE_CLASS_KEY = "_ng_failure_class"
# Error text kept on the row: enough to diagnose, bounded so a huge upstream body stays out.
MAX_ERROR_CHARS = 2000


class JudgeError(Exception):
    """A judge call failed; :func:`judge_failsafe` turns it into a ``judge_failed`` verify answer."""


async def reraise_judge_errors(coro: Awaitable[Any]) -> Any:
    """Await ``coro``; any exception but :class:`JudgeError` is raised again as one, named
    ``"<ExceptionType>: <message>"``."""
    try:
        return await coro
    except JudgeError:
        raise
    except Exception as exc:
        raise JudgeError(f"{type(exc).__name__}: {exc}") from exc


async def call_judge(
    server_client: Any,
    *,
    server_name: str,
    url_path: str,
    json: Any,
    response_model: type[ResponseT],
) -> ResponseT:
    """POST ``json`` to ``server_name``'s ``url_path`` (``/v1/responses`` or
    ``/v1/chat/completions``) and parse the answer as ``response_model``.

    Raises :class:`JudgeError` when the call fails or answers a non-2xx status (the status is
    checked before parsing, so an auth error reads as one, not as a validation error).
    """

    async def ask() -> ResponseT:
        response = await server_client.post(server_name=server_name, url_path=url_path, json=json)
        if not response.ok:
            body = await response.read()
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
            raise JudgeError(f"judge {server_name!r}{url_path} answered HTTP {response.status}: {text[:500]}")
        return response_model.model_validate(await get_response_json(response))

    result: ResponseT = await reraise_judge_errors(ask())
    return result


def _request_body(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The verify request among a verify's arguments: ``body=``, else the first pydantic model
    with a ``response`` field."""
    if kwargs.get("body") is not None:
        return kwargs["body"]
    for value in (*kwargs.values(), *args):
        if isinstance(value, BaseModel) and hasattr(value, "response"):
            return value
    return None


def judge_failed_answer(body: BaseModel, error: JudgeError) -> JSONResponse:
    """The verify answer for a request whose judge failed: ``body``'s own fields plus
    ``reward: 0.0``, ``mask_sample: true``, ``failure_kind``/``_ng_failure_class: "judge_failed"``,
    ``failure_reason`` and ``_ng_failure_judge_error`` (the error, at most 2,000 characters)."""
    reason = str(error)[:MAX_ERROR_CHARS]
    data = body.model_dump(mode="json")
    instance_config = data.get("instance_config")
    data.update(
        reward=0.0,
        mask_sample=True,
        failure_kind=JUDGE_FAILED,
        failure_reason=reason,
        # Trainers that read the mask from instance_config still see it.
        instance_config={
            **(instance_config if isinstance(instance_config, dict) else {}),
            "mask_sample": True,
        },
        **{FAILURE_CLASS_KEY: JUDGE_FAILED, "_ng_failure_judge_error": reason},
    )
    return JSONResponse(content=data)


def judge_failsafe(verify_fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap ``verify_fn`` so that a :class:`JudgeError` answers :func:`judge_failed_answer`.

    The wrapper keeps ``verify_fn``'s signature, so a web framework injects the same arguments.
    Every resources server's ``/verify`` route applies the same rule, as NeMo Gym's base class
    wraps every verify endpoint in it.
    """

    @functools.wraps(verify_fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await verify_fn(*args, **kwargs)
        except JudgeError as exc:
            body = _request_body(args, kwargs)
            if body is None:
                raise RuntimeError("judge_failsafe: no verify request body among the arguments") from exc
            return judge_failed_answer(body, exc)

    return wrapper
