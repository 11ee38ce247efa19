"""A resources server's ``/verify`` as a reward function for TRL's trainers (GRPO and kin).

TRL generates with its own copy of the policy; each completion is scored by POSTing the row it
was sampled for, plus the completion as a one-message Responses API answer, to a running
resources server's real ``/verify`` over HTTP. The reward is the server's own ``reward`` field:
nothing is re-implemented here.

Rows are NeMo Gym JSONL rows (``responses_create_params.input`` and the environment's own
fields). :func:`trl_dataset_columns` turns them into the two columns TRL needs: ``prompt`` (the
chat messages) and ``ng_row`` (the whole row as JSON, handed back to the reward function by
TRL). A ``/verify`` that fails (connection refused, a 4xx/5xx answer, no ``reward`` in the body)
raises :class:`VerifyRewardError` naming the server, the status and the body: an infrastructure
fault stops training rather than being learned as a zero reward.

``trl`` itself is not imported here: :class:`VerifyReward` is a plain callable with the
signature TRL calls reward functions with (``prompts``, ``completions``, dataset columns as
keyword arguments).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nemo_gym.global_config import get_first_server_config_dict
from nemo_gym.response_items import message_item

__all__ = [
    "ROW_COLUMN",
    "VerifyReward",
    "VerifyRewardError",
    "completion_text",
    "server_url",
    "trl_dataset_columns",
]

ROW_COLUMN = "ng_row"


class VerifyRewardError(RuntimeError):
    """A ``/verify`` call that produced no reward (an infrastructure fault, never a zero reward)."""


def trl_dataset_columns(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``{"prompt": [...], "ng_row": [...]}`` for ``datasets.Dataset.from_dict``.

    ``prompt`` is each row's ``responses_create_params.input`` as chat messages (a string input
    becomes one user message); ``ng_row`` is the row itself as JSON. Raises ``ValueError`` naming
    the row's index when its input is missing or holds a non-message item.
    """
    prompts: list[list[dict[str, str]]] = []
    encoded: list[str] = []
    for index, row in enumerate(rows):
        params = row.get("responses_create_params")
        value = params.get("input") if isinstance(params, Mapping) else None
        if isinstance(value, str):
            messages = [{"role": "user", "content": value}]
        elif isinstance(value, list) and value:
            messages = []
            for item in value:
                content = item.get("content") if isinstance(item, Mapping) else None
                if not isinstance(content, str) or item.get("role") not in (
                    "system",
                    "developer",
                    "user",
                    "assistant",
                ):
                    raise ValueError(
                        f"row {index}: responses_create_params.input holds {item!r}; TRL prompts need "
                        "messages with a role and string content"
                    )
                messages.append({"role": str(item["role"]), "content": content})
        else:
            raise ValueError(f"row {index}: responses_create_params.input is missing or empty")
        prompts.append(messages)
        encoded.append(json.dumps(dict(row)))
    return {"prompt": prompts, ROW_COLUMN: encoded}


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a list of chat messages (the assistant's joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(
            str(m.get("content") or "")
            for m in completion
            if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant"
        )
    raise TypeError(f"a TRL completion is a string or a list of messages, not {type(completion).__name__}")


def server_url(global_config: Any, name: str) -> str:
    """``http://host:port`` of the server instance ``name`` in a running stack's global config."""
    try:
        block = get_first_server_config_dict(global_config, name)
    except (KeyError, StopIteration, AttributeError) as exc:
        raise ValueError(f"no server instance named {name!r} in the stack's config") from exc
    return f"http://{block['host']}:{block['port']}"


class VerifyReward:
    """TRL reward function: the reward ``<base_url>/verify`` gives each completion.

    Args:
        base_url: the resources server (``http://host:port``).
        timeout_s: per-call deadline.
        max_workers: concurrent ``/verify`` calls per batch.

    After each call, :attr:`history` has gained one list: the rewards of that batch, in order.
    """

    __name__ = "nemo_gym_verify"

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, max_workers: int = 8) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self.history: list[list[float]] = []

    def verify(self, row: Mapping[str, Any], text: str) -> float:
        """POST one row with ``text`` as the policy's answer; the body's ``reward``."""
        body = json.dumps({**row, "response": {"output": [message_item(text)]}}).encode()
        request = urllib.request.Request(
            self.base_url + "/verify", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        url = self.base_url + "/verify"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310 - http URL
                payload = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise VerifyRewardError(f"{url} answered {exc.code}: {detail}") from exc
        except (OSError, ValueError) as exc:
            raise VerifyRewardError(f"{url} could not be called: {exc}") from exc
        reward = payload.get("reward") if isinstance(payload, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise VerifyRewardError(f"{url} answered without a numeric reward: {str(payload)[:500]}")
        return float(reward)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        """Score a batch; ``columns[ROW_COLUMN]`` holds each completion's row as JSON."""
        rows = columns.get(ROW_COLUMN)
        if rows is None or len(rows) != len(completions):
            raise ValueError(
                f"the dataset needs an {ROW_COLUMN!r} column (see trl_dataset_columns) with one row per completion"
            )
        texts = [completion_text(c) for c in completions]
        parsed = [json.loads(r) if isinstance(r, str) else dict(r) for r in rows]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_workers, len(texts)))) as pool:
            rewards = list(pool.map(self.verify, parsed, texts))
        self.history.append(rewards)
        return rewards
