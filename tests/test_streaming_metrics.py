"""MetricsAccumulator (streamed aggregate metrics) gives exactly what compute_aggregate_metrics gives."""

from __future__ import annotations

import io
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym.collection.metrics import compute_aggregate_metrics
from nemo_gym.collection.streaming_metrics import MetricsAccumulator, write_metrics_answer


def streamed(rows: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    accumulator = MetricsAccumulator(**kwargs)
    for row in rows:
        accumulator.add(row)
    return accumulator.result()


def written(rows: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    accumulator = MetricsAccumulator(**kwargs)
    for row in rows:
        accumulator.add(row)
    sink = io.BytesIO()
    write_metrics_answer(sink, accumulator)
    return orjson.loads(sink.getvalue())  # type: ignore[no-any-return]


def mixed_rows(seed: int, count: int) -> list[dict[str, Any]]:
    """Rows in scrambled order: several rollouts per task, missing fields, usage, components."""
    rng = random.Random(seed)
    rows = []
    for task in range(count // 4):
        for run in range(rng.choice([1, 3, 4, 5])):
            row: dict[str, Any] = {"_ng_task_index": task, "_ng_rollout_index": run, "question": f"q{task}"}
            if rng.random() < 0.9:
                row["reward"] = rng.choice([0.0, 1.0, 1, 0]) if task % 3 else rng.random()
            if rng.random() < 0.8:
                row["response"] = {
                    "output": [{"type": "message"}],
                    "usage": {
                        "input_tokens": rng.randint(1, 500),
                        "output_tokens": rng.randint(1, 50),
                        "output_tokens_details": {"reasoning_tokens": rng.randint(0, 9)},
                    },
                }
            if rng.random() < 0.5:
                row["reward_components"] = {"format": rng.random(), "answer": rng.choice([0, 1])}
            if rng.random() < 0.7:
                row["extracted_answer"] = rng.choice(["A", "B", "C", ["x", 1]])
            row["latency_s"] = rng.random() * 3
            rows.append(row)
    rows += [{"reward": 1.0, "note": "no task index"}, {"reward": 0.0}]
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"answer_field": "extracted_answer"},
        {"ks": [1, 2, 3]},
        {"score_fields": ("reward", "reward_components/format"), "ks": [2]},
    ],
)
def test_streamed_metrics_equal_the_list_computation(seed: int, kwargs: dict[str, Any]) -> None:
    rows = mixed_rows(seed, 200)
    expected = compute_aggregate_metrics(rows, **kwargs)
    assert streamed(rows, **kwargs) == expected
    assert written(rows, **kwargs) == orjson.loads(orjson.dumps(expected))


def test_task_indices_of_other_types_and_sparse_ints() -> None:
    rows = [
        {"_ng_task_index": 10**15, "_ng_rollout_index": 1, "reward": 1.0},
        {"_ng_task_index": 10**15, "_ng_rollout_index": 0, "reward": 0.0},
        {"_ng_task_index": 3, "_ng_rollout_index": "b", "reward": 0.5},
        {"_ng_task_index": 3, "_ng_rollout_index": "a", "reward": 0.25},
    ]
    assert streamed(rows) == compute_aggregate_metrics(rows)  # sparse ints: an id table
    rows.append({"_ng_task_index": "t-7", "_ng_rollout_index": 0, "reward": 1.0})
    assert streamed(rows) == compute_aggregate_metrics(rows)  # mixed types: first-seen order
    rows.append({"_ng_task_index": [1, 2], "reward": 1.0, "_ng_rollout_index": 2.5})
    assert streamed(rows) == compute_aggregate_metrics(rows)


def test_empty_input() -> None:
    assert streamed([]) == compute_aggregate_metrics([])
    assert written([]) == compute_aggregate_metrics([])


values = st.one_of(st.none(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.booleans())
indices = st.one_of(st.none(), st.integers(0, 4), st.integers(-2, 2), st.sampled_from(["a", "b"]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "_ng_task_index": indices,
                "_ng_rollout_index": indices,
                "reward": values,
                "answer": st.one_of(st.none(), st.sampled_from(["x", "y"])),
                "score2": values,
            },
        ),
        max_size=25,
    )
)
def test_streamed_equals_list_on_arbitrary_rows(rows: list[dict[str, Any]]) -> None:
    kwargs = {"answer_field": "answer", "score_fields": ("reward", "score2")}
    assert streamed(rows, **kwargs) == compute_aggregate_metrics(rows, **kwargs)
