"""NeMo Gym's reasoning_gym verify test cases (its tests/test_app.py), as data.

Its tests build entries with ``reasoning_gym.create_dataset(task, size=1, seed=42)`` and answer
with the entry's own answer (NeMo Gym: reward >= 0.9, i.e. 1.0) or with junk (<= 0.1, i.e. 0.0).
"""

from typing import Any

import reasoning_gym

from nemo_gym.response_items import message_item
from nemo_gym.testing import ParityCase


def entry(task: str) -> dict[str, Any]:
    """The first entry of the task's seed-42 dataset."""
    return reasoning_gym.create_dataset(task, size=1, seed=42)[0]


def case(name: str, task: str, text: str | None, reward: float) -> ParityCase:
    """A row from ``task``'s entry answered with ``text`` (None: the entry's own answer)."""
    item = entry(task)
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": item["question"]}]},
        "question": item["question"],
        "answer": item["answer"],
        "metadata": item["metadata"],
    }
    answer = item["answer"] if text is None else text
    return ParityCase(name, row, [message_item(answer)], reward, {"task_name": task})


CASES = [
    case("knights_knaves right", "knights_knaves", None, 1.0),
    case("knights_knaves wrong", "knights_knaves", "This is completely wrong", 0.0),
    case("several tasks: knights_knaves", "knights_knaves", None, 1.0),
    case("several tasks: leg_counting", "leg_counting", None, 1.0),
    case("several tasks: basic_arithmetic", "basic_arithmetic", None, 1.0),
]
