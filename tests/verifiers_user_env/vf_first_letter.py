"""A verifiers environment written the way a verifiers user writes theirs (``load_environment``
returning a ``SingleTurnEnv`` with a rubric), for NeMo Gym's pulled ``verifiers_agent`` folder:
its config names an environment by id (``vf_env_id``) and ``verifiers.load_environment`` imports
the module of that name. Prime Intellect's own environments (the folder's example,
``acereason-math``) are published on Prime Intellect's package index, which CI cannot reach.

The task: reply with a letter; the rubric's one function scores 1.0 when the reply's first
non-space character is the row's ``answer``.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def _field(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _reply_text(completion: Any) -> str:
    """The last assistant message's text (messages are dicts or verifiers' typed messages)."""
    if isinstance(completion, str):
        return completion
    texts = [_field(m, "content") for m in completion if _field(m, "role") == "assistant"]
    return texts[-1] if texts and isinstance(texts[-1], str) else ""


def first_letter(completion: Any, answer: str, **kwargs: Any) -> float:
    """1.0 when the reply starts with the expected letter."""
    return float(_reply_text(completion).strip()[:1] == answer)


def load_environment(**kwargs: Any) -> vf.Environment:
    """Five questions answered by a letter; reward: the reply's first letter."""
    dataset = Dataset.from_dict(
        {
            "question": [f"Reply with the letter {letter} only." for letter in "ABCDE"],
            "answer": list("ABCDE"),
        }
    )
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[first_letter], weights=[1.0]), **kwargs)
