"""Default aggregate metrics for verified rollouts: the answer of ``POST /aggregate_metrics``.

A verify response is one rollout's row after ``/verify``: the task fields, ``response`` (a
Responses API object), ``reward`` and any diagnostic fields, plus the collector's
``_ng_task_index`` and ``_ng_rollout_index``. :func:`compute_aggregate_metrics` turns a list of
them into ``{"agent_metrics", "key_metrics", "group_level_metrics"}``:

- ``mean/<field>``, ``max/<field>``, ``min/<field>``, ``std/<field>`` for every numeric field, as
  raw values (see :func:`extract_numeric_fields` for which fields count).
- For each score field (``reward`` by default), over rollouts grouped by task:
  ``pass@{k}/<score>``, ``pass@1[avg-of-{k}]/<score>``, ``majority@{k}/<score>`` (only with an
  ``answer_field``) and ``std_err_across_runs/<score>``, all as percentages 0-100.

Everything here is pure: no I/O, no global state, no third-party imports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Iterable, Mapping, MutableSequence, Sequence
from typing import Any, NamedTuple, TypeGuard

TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
REWARD_COMPONENTS_KEY = "reward_components"

# Keys the collector and engines add that are bookkeeping, not measurements.
_INTERNAL_KEY_PREFIX = "_ng_"
# Per-token arrays an RL run attaches to output items (and some trainers hoist to the row).
TOKEN_ID_KEYS = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
# Common JSON types that are never measurements, skipped without an ABC check.
_NOT_NUMBERS = frozenset({str, dict, list, type(None), bool})
_NOT_MAPPINGS = frozenset({str, int, float, list, type(None), bool})
# Types of task indices, rollout indices and answers usable as dict keys as they are.
_SIMPLE_KEYS = frozenset({int, str, type(None)})


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct.

    Returns ``1 - C(n-c, k) / C(n, k)``: the probability that at least one of ``k`` samples drawn
    without replacement from the ``n`` is correct. Computed as the product
    ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` so it never forms the (huge) binomials.

    Raises ``ValueError`` unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # Multiplying from i=n downwards makes a larger c only append factors <= 1 to the same
    # product, so the rounded result stays monotone in c (and each factor shrinks with k).
    miss = 1.0
    for i in range(n, n - c, -1):
        miss *= 1.0 - k / i
    return 1.0 - miss


# Larger magnitudes are not metrics (a sum or a square of them overflows a float): they are
# skipped like NaN and infinities, instead of failing the whole aggregation.
MAX_METRIC_MAGNITUDE = 1e150


def is_percent_metric(name: str) -> bool:
    """Whether a metric is in percent (0-100): pass@k, pass@1[avg-of-k] and majority@k, with their
    standard errors, as NeMo Gym writes them; ``mean/*`` and the rest are raw values."""
    return name.startswith(("pass@", "majority@", "std_err_across_runs"))


def _as_number(value: Any) -> float | None:
    """``value`` as a float, or ``None`` for bools, non-numbers, NaN, infinities and magnitudes
    past :data:`MAX_METRIC_MAGNITUDE`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if -MAX_METRIC_MAGNITUDE <= number <= MAX_METRIC_MAGNITUDE else None


def _add_numbers(
    fields: dict[str, float], prefix: str, source: Mapping[str, Any], skip_internal: bool
) -> None:
    """Put each finite numeric value of ``source`` into ``fields`` as ``prefix + key``."""
    # Exact-type checks before the general ones: this runs for every field of every rollout.
    for key, value in source.items():
        value_type = type(value)
        if value_type is float:
            if not -MAX_METRIC_MAGNITUDE <= value <= MAX_METRIC_MAGNITUDE:  # also NaN and infinities
                continue
        elif value_type in _NOT_NUMBERS:
            continue
        else:
            value = _as_number(value)
            if value is None:
                continue
        if skip_internal and key.startswith(_INTERNAL_KEY_PREFIX):
            continue
        fields[prefix + key] = value


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is a mapping (plain types checked first: the ABC check is slow)."""
    value_type = type(value)
    return value_type is dict or (value_type not in _NOT_MAPPINGS and isinstance(value, Mapping))


def extract_numeric_fields(verify_response: Mapping[str, Any]) -> dict[str, float]:
    """The measurements in one verify response, flattened to ``{name: value}``.

    Counted: every top-level int or float (bools, NaN and infinities are skipped, as are
    ``_ng_*`` bookkeeping keys such as the task and rollout indices); each numeric entry of
    ``reward_components`` as ``reward_components/<name>``; each numeric entry of
    ``response.usage`` as ``usage/<key>``, and of its nested details as
    ``usage/<key>/<sub_key>`` (for example ``usage/output_tokens_details/reasoning_tokens``).
    Everything else (``response.output``, ``responses_create_params``, strings) is ignored.
    """
    fields: dict[str, float] = {}
    _add_numbers(fields, "", verify_response, skip_internal=True)
    components = verify_response.get(REWARD_COMPONENTS_KEY)
    if _is_mapping(components):
        _add_numbers(fields, REWARD_COMPONENTS_KEY + "/", components, skip_internal=False)
    response = verify_response.get("response")
    usage = response.get("usage") if _is_mapping(response) else None
    if _is_mapping(usage):
        _add_numbers(fields, "usage/", usage, skip_internal=False)
        for key, value in usage.items():
            if _is_mapping(value):
                _add_numbers(fields, f"usage/{key}/", value, skip_internal=False)
    return fields


def strip_heavy_fields(verify_response: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``verify_response`` without what metrics never read, to keep uploads small.

    Drops ``response.output``, ``responses_create_params.input`` and token-id arrays
    (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) at the top level
    and on ``response``. Keeps ``response.usage``, numeric fields, ``reward_components``, the
    ``_ng_*`` indices and every other task field (an answer field for majority voting included).
    The input is not modified.
    """
    stripped = {key: value for key, value in verify_response.items() if key not in TOKEN_ID_KEYS}
    response = stripped.get("response")
    if isinstance(response, Mapping):
        stripped["response"] = {
            key: value for key, value in response.items() if key != "output" and key not in TOKEN_ID_KEYS
        }
    params = stripped.get("responses_create_params")
    if isinstance(params, Mapping):
        stripped["responses_create_params"] = {key: value for key, value in params.items() if key != "input"}
    return stripped


class _Rollout(NamedTuple):
    """One verify response reduced to what aggregation reads."""

    order: tuple[int, float, int]
    rollout_index: Hashable | None
    fields: dict[str, float]
    answer: Hashable | None


def _hashable(value: Any) -> Hashable:
    """``value`` itself if hashable, else a canonical JSON string standing in for it."""
    if type(value) in _SIMPLE_KEYS:
        return value  # type: ignore[no-any-return]
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)
    return value  # type: ignore[no-any-return]


def _std(values: Sequence[float], mean: float) -> float:
    """Sample standard deviation (ddof=1); 0.0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _check_ks(ks: Iterable[int] | None) -> list[int] | None:
    """Sorted, de-duplicated ``ks``; raises ``ValueError`` naming a bad entry."""
    if ks is None:
        return None
    checked = list(ks)
    for k in checked:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ks must hold positive integers, got {k!r}")
    return sorted(set(checked))


def _group_rollouts(
    verify_responses: Iterable[Mapping[str, Any]], score_fields: Sequence[str], answer_field: str | None
) -> tuple[list[tuple[Any, list[_Rollout]]], dict[str, list[float]]]:
    """Rollouts grouped by task (sorted by task index, ungrouped rows last, one group each),
    each group ordered by rollout index; and every numeric field's values over all rollouts."""
    groups: dict[Hashable, list[_Rollout]] = {}
    task_indices: dict[Hashable, Any] = {}
    ungrouped: list[tuple[Any, list[_Rollout]]] = []
    field_values: dict[str, list[float]] = {}
    for position, row in enumerate(verify_responses):
        fields = extract_numeric_fields(row)
        for name in score_fields:
            # A bool score (e.g. ``is_correct``) is a 0/1 score, though bools are not fields.
            if name not in fields and isinstance(row.get(name), bool):
                fields[name] = float(row[name])
        for name, value in fields.items():
            values = field_values.get(name)
            if values is None:
                field_values[name] = [value]
            else:
                values.append(value)
        answer = row.get(answer_field) if answer_field is not None else None
        rollout_index = row.get(ROLLOUT_INDEX_KEY)
        if type(rollout_index) is int:
            order: tuple[int, float, int] = (0, rollout_index, position)
        else:
            numeric_index = _as_number(rollout_index)
            order = (0, numeric_index, position) if numeric_index is not None else (1, 0.0, position)
        rollout = _Rollout(order, _hashable(rollout_index), fields, _hashable(answer))
        task_index = row.get(TASK_INDEX_KEY)
        if task_index is None:
            ungrouped.append((None, [rollout]))
            continue
        key = _hashable(task_index)
        group = groups.get(key)
        if group is None:
            groups[key] = [rollout]
            task_indices[key] = task_index
        else:
            group.append(rollout)
    keys = list(groups)
    try:
        keys.sort(key=lambda key: task_indices[key])
    except TypeError:
        pass  # task indices of mixed types: keep first-seen order
    ordered = [(task_indices[key], sorted(groups[key], key=lambda r: r.order)) for key in keys]
    return ordered + ungrouped, field_values


def _majority_scores(scored: Sequence[tuple[float, Hashable | None]]) -> list[float]:
    """For each prefix length m of ``scored`` (pairs of score and answer), the majority-vote
    score over the first m: the most common non-None answer, ties going to the answer seen
    first, scored as that answer's first rollout. 0.0 while no answer has been given."""
    counts: dict[Hashable, int] = {}
    first_seen: dict[Hashable, tuple[int, float]] = {}
    leader: Hashable | None = None
    leader_count = 0
    out: list[float] = []
    for position, (score, answer) in enumerate(scored):
        if answer is not None:
            count = counts.get(answer, 0) + 1
            counts[answer] = count
            if answer not in first_seen:
                first_seen[answer] = (position, score)
            if leader is None or count > leader_count:
                leader, leader_count = answer, count
            elif count == leader_count and first_seen[answer][0] < first_seen[leader][0]:
                leader = answer
        out.append(first_seen[leader][1] if leader is not None else 0.0)
    return out


def _percent_mean(values: Sequence[float]) -> float:
    """Mean of ``values`` as a percentage."""
    return 100.0 * math.fsum(values) / len(values)


def _score_metrics(
    score: str,
    groups: Sequence[tuple[Any, list[_Rollout]]],
    all_values: list[float],
    ks: list[int] | None,
    with_majority: bool,
) -> dict[str, float]:
    """``pass@k``, ``pass@1[avg-of-k]``, ``majority@k`` and ``std_err_across_runs`` for one score."""
    binary = all(value == 0.0 or value == 1.0 for value in all_values)
    tasks: list[list[tuple[float, Hashable | None]]] = []
    run_sums: dict[Hashable, list[float]] = {}
    for _, rollouts in groups:
        scored = []
        for position, rollout in enumerate(rollouts):
            value = rollout.fields.get(score)
            if value is None:
                continue
            scored.append((value, rollout.answer))
            # Run r is every task's r-th rollout; rows without an index count by position.
            run = rollout.rollout_index if rollout.rollout_index is not None else position
            run_sums.setdefault(run, []).append(value)
        if scored:
            tasks.append(scored)
    if not tasks:
        return {}
    # An answer field that no rollout carries would report every task as wrong; say nothing.
    with_majority = with_majority and any(answer is not None for task in tasks for _, answer in task)
    k_values = ks if ks is not None else list(range(1, min(len(task) for task in tasks) + 1))

    pass_by_k: dict[int, list[float]] = {k: [] for k in k_values}
    avg_by_k: dict[int, list[float]] = {k: [] for k in k_values}
    majority_by_k: dict[int, list[float]] = {k: [] for k in k_values}
    binary_cache: dict[tuple[int, int, int], float] = {}
    for scored in tasks:
        add_task_estimates(
            scored, k_values, binary, with_majority, binary_cache, pass_by_k, avg_by_k, majority_by_k
        )

    return score_metrics(score, k_values, pass_by_k, avg_by_k, majority_by_k, list(run_sums.values()))


def add_task_estimates(
    scored: Sequence[tuple[float, Hashable | None]],
    k_values: Sequence[int],
    binary: bool,
    with_majority: bool,
    binary_cache: dict[tuple[int, int, int], float],
    pass_by_k: Mapping[int, MutableSequence[float]],
    avg_by_k: Mapping[int, MutableSequence[float]],
    majority_by_k: Mapping[int, MutableSequence[float]],
) -> None:
    """Append one task's ``pass@k``, ``pass@1[avg-of-k]`` and ``majority@k`` estimates, at each k.

    ``scored`` is the task's (value, answer) per rollout, in order. Binary scores use the unbiased
    ``pass@k`` estimator (cached per (n, correct, k) in ``binary_cache``), others the best of the
    first k. Shared by the batch and the streaming aggregates, so both compute the same numbers.
    """
    n = len(scored)
    prefix_sums = [0.0]
    prefix_max: list[float] = []
    for value, _ in scored:
        prefix_sums.append(prefix_sums[-1] + value)
        prefix_max.append(value if not prefix_max else max(prefix_max[-1], value))
    correct = int(prefix_sums[-1]) if binary else 0
    majority = _majority_scores(scored) if with_majority else []
    for k in k_values:
        if k > n:
            continue  # this task has too few rollouts to say anything at this k
        if binary:
            key = (n, correct, k)
            estimate = binary_cache.get(key)
            if estimate is None:
                estimate = binary_cache[key] = pass_at_k(n, correct, k)
            pass_by_k[k].append(estimate)
        else:
            pass_by_k[k].append(prefix_max[k - 1])
        avg_by_k[k].append(prefix_sums[k] / k)
        if with_majority:
            majority_by_k[k].append(majority[k - 1])


def score_metrics(
    score: str,
    k_values: Sequence[int],
    pass_by_k: Mapping[int, Sequence[float]],
    avg_by_k: Mapping[int, Sequence[float]],
    majority_by_k: Mapping[int, Sequence[float]] | None,
    run_values: Sequence[Sequence[float]],
) -> dict[str, float]:
    """One score's pass@k, pass@1[avg-of-k], majority@k (when given) and the standard error across runs."""
    metrics: dict[str, float] = {}
    for k in k_values:
        if pass_by_k[k]:
            metrics[f"pass@{k}/{score}"] = _percent_mean(pass_by_k[k])
    for k in k_values:
        if avg_by_k[k]:
            metrics[f"pass@1[avg-of-{k}]/{score}"] = _percent_mean(avg_by_k[k])
    if majority_by_k is not None:
        for k in k_values:
            if majority_by_k[k]:
                metrics[f"majority@{k}/{score}"] = _percent_mean(majority_by_k[k])
    if len(run_values) >= 2:
        run_means = [_percent_mean(values) for values in run_values]
        grand_mean = math.fsum(run_means) / len(run_means)
        metrics[f"std_err_across_runs/{score}"] = _std(run_means, grand_mean) / math.sqrt(len(run_means))
    return metrics


def _highest_k_key(metrics: Mapping[str, float], prefix: str, suffix: str) -> str | None:
    """The key ``f"{prefix}{k}{suffix}"`` in ``metrics`` with the largest integer k, if any."""
    best: tuple[int, str] | None = None
    for key in metrics:
        if key.startswith(prefix) and key.endswith(suffix):
            middle = key[len(prefix) : len(key) - len(suffix)]
            if middle.isdigit() and (best is None or int(middle) > best[0]):
                best = (int(middle), key)
    return best[1] if best is not None else None


def select_key_metrics(agent_metrics: Mapping[str, float], score_fields: Sequence[str]) -> dict[str, float]:
    """The headline subset of ``agent_metrics`` to print: for each score, its ``mean/``, and the
    highest-k ``pass@k``, ``pass@1[avg-of-k]`` and ``majority@k`` present."""
    key_metrics: dict[str, float] = {}
    for score in score_fields:
        keys = [
            f"mean/{score}",
            _highest_k_key(agent_metrics, "pass@", f"/{score}"),
            _highest_k_key(agent_metrics, "pass@1[avg-of-", f"]/{score}"),
            _highest_k_key(agent_metrics, "majority@", f"/{score}"),
        ]
        for key in keys:
            if key is not None and key in agent_metrics:
                key_metrics[key] = agent_metrics[key]
    return key_metrics


def compute_aggregate_metrics(
    verify_responses: Iterable[Mapping[str, Any]],
    *,
    score_fields: Sequence[str] = ("reward",),
    answer_field: str | None = None,
    ks: Iterable[int] | None = None,
) -> dict[str, Any]:
    """Aggregate verify responses into ``{"agent_metrics", "key_metrics", "group_level_metrics"}``.

    ``agent_metrics`` holds, over all rollouts, ``mean/``, ``max/``, ``min/`` and ``std/``
    (sample std, ddof=1; 0 for one rollout) of every numeric field (see
    :func:`extract_numeric_fields`) as raw values. For each name in ``score_fields`` (a numeric
    field, flattened names such as ``reward_components/format`` allowed; a field no rollout
    has is skipped), rollouts are grouped by ``_ng_task_index`` (a row without one is its own
    task) and ordered by ``_ng_rollout_index``; then, for k in ``ks`` (default 1 up to the
    smallest task's rollout count), over the tasks with at least k rollouts, as percentages:

    - ``pass@{k}/<score>``: for binary scores (every value 0 or 1) the mean over tasks of
      :func:`pass_at_k` over all the task's rollouts; for other scores the mean of the best of
      the first k.
    - ``pass@1[avg-of-{k}]/<score>``: the mean over tasks of the mean of the first k scores.
    - ``majority@{k}/<score>`` (only when ``answer_field`` is given): per task the most common
      non-null ``answer_field`` value among the first k, ties going to the answer seen first,
      scored as the first rollout that gave it (0 when none of the k gave an answer). Absent
      when no rollout carries the answer field.
    - ``std_err_across_runs/<score>``: rollout index r is run r; the standard error (std with
      ddof=1 over sqrt(runs)) of the runs' mean scores. Absent with a single run.

    ``group_level_metrics`` has one entry per task: ``_ng_task_index`` (``None`` for a row
    without one), ``count`` and ``mean/<field>`` for the numeric fields its rollouts have.
    ``key_metrics`` is the headline subset chosen by :func:`select_key_metrics`.

    Raises ``ValueError`` if ``ks`` holds anything but positive integers.
    """
    if isinstance(score_fields, str):
        score_fields = (score_fields,)
    checked_ks = _check_ks(ks)
    groups, field_values = _group_rollouts(verify_responses, score_fields, answer_field)

    agent_metrics: dict[str, float] = {}
    for name in sorted(field_values):
        values = field_values[name]
        mean = math.fsum(values) / len(values)
        agent_metrics[f"mean/{name}"] = mean
        agent_metrics[f"max/{name}"] = max(values)
        agent_metrics[f"min/{name}"] = min(values)
        agent_metrics[f"std/{name}"] = _std(values, mean)
    for score in score_fields:
        if score in field_values:
            agent_metrics.update(
                _score_metrics(score, groups, field_values[score], checked_ks, answer_field is not None)
            )

    group_level_metrics: list[dict[str, Any]] = []
    for task_index, rollouts in groups:
        sums: dict[str, list[float]] = {}
        for rollout in rollouts:
            for name, value in rollout.fields.items():
                sums.setdefault(name, []).append(value)
        entry: dict[str, Any] = {TASK_INDEX_KEY: task_index, "count": len(rollouts)}
        for name in sorted(sums):
            entry[f"mean/{name}"] = math.fsum(sums[name]) / len(sums[name])
        group_level_metrics.append(entry)

    return {
        "agent_metrics": agent_metrics,
        "key_metrics": select_key_metrics(agent_metrics, score_fields),
        "group_level_metrics": group_level_metrics,
    }
