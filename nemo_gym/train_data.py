"""Training sequences from verified rollouts: token IDs, loss mask and log-probs, laid end to end.

A rollout row (as the collector writes it) holds the row fields, ``reward`` and ``response``,
whose ``output`` lists every item of the rollout in order: what the model produced
(``reasoning``, assistant ``message``, ``function_call``) and what the environment answered
(``function_call_output``). With ``return_token_id_information: true`` on the policy model,
each model call's last output item carries ``prompt_token_ids``, ``generation_token_ids`` and
``generation_log_probs``, and the engine's splice (:mod:`nemo_gym.models.token_ids`) makes every
call's prompt start with the previous call's prompt + generation. A trainer can then lay the
calls end to end as one sequence and train only on what the policy sampled:

- :func:`model_calls` reads the per-call token records out of a response;
- :func:`build_training_sequence` checks that each call's prompt extends the sequence so far
  and builds ``input_ids``, ``loss_mask`` and ``logprobs``;
- ``ng_export_training_data`` does it for a whole rollouts JSONL file, streaming.

Where a prompt does not extend the sequence, the sequence stops before that call and is
marked ``contiguous=False`` (see :func:`build_training_sequence` for why it stops instead of
starting a second sequence). See "Training sequences" in ``docs/TOKEN_IDS.md``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, load_config
from nemo_gym.models.token_ids import TOKEN_ID_FIELDS
from nemo_gym.response_items import is_model_item

__all__ = [
    "INDEX_FIELDS",
    "ExportSummary",
    "ModelCall",
    "TrainingDataError",
    "TrainingSequence",
    "build_training_sequence",
    "split_training_sequences",
    "export_training_data",
    "model_calls",
    "ng_export_training_data",
]

# Row fields the collector adds; copied onto each exported sequence so a trainer can group
# sequences by task (GRPO-style baselines) and match them back to their rollout.
INDEX_FIELDS: Final[tuple[str, ...]] = ("_ng_task_index", "_ng_rollout_index")


class TrainingDataError(ValueError):
    """A rollout cannot be turned into a training sequence; the message names the row and field."""


@dataclass(frozen=True)
class ModelCall:
    """The token record of one model call in a rollout.

    ``index`` counts model calls from 0 in output order; ``output_index`` is the position in
    ``response.output`` of the item that carries the IDs (the call's last item) and
    ``item_types`` the types of all the call's items. ``token_ids_contiguous`` is the engine's
    own flag on that item: False when its splice was refused, None when the engine set none.
    """

    index: int
    output_index: int
    item_types: tuple[str, ...]
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    token_ids_contiguous: bool | None = None


@dataclass(frozen=True)
class TrainingSequence:
    """One rollout as one training sequence.

    ``input_ids``, ``loss_mask`` and ``logprobs`` have the same length. ``loss_mask`` is 1
    exactly where the policy sampled the token (each call's generation) and 0 on everything
    the template or the environment wrote (system and user turns, tool results, role headers).
    ``logprobs`` holds the sampling log-prob where the mask is 1 and 0.0 elsewhere.

    ``num_calls`` is the number of model calls in the rollout. ``contiguous`` is True when
    every call extends the sequence; otherwise ``break_at_call`` is the 0-based index of the
    first call that does not, and the sequence holds only calls ``0 .. break_at_call - 1``.
    ``replaced_turn_ends`` counts sampled turn-end tokens that the next prompt replaced by the
    template's (only with several configured turn-end IDs; those positions are masked out).
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    contiguous: bool
    num_calls: int
    break_at_call: int | None = None
    replaced_turn_ends: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready fields written by ``ng_export_training_data``."""
        return {
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "reward": self.reward,
            "contiguous": self.contiguous,
            "num_calls": self.num_calls,
            "break_at_call": self.break_at_call,
        }


def _describe(item: Mapping[str, Any], index: int) -> str:
    kind = item.get("type") or ("message" if "role" in item else "?")
    return f"response.output[{index}] ({kind})"


def _int_list(value: Any, where: str, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TrainingDataError(f"{where}.{name} must be a list of integer token IDs")
    return value


def _float_list(value: Any, where: str, name: str) -> list[float]:
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise TrainingDataError(f"{where}.{name} must be a list of numbers (log-probs)")
    return [float(v) for v in value]


def model_calls(response: Mapping[str, Any]) -> list[ModelCall]:
    """The token records of a response's model calls, in output order.

    A model call is a run of model-produced items (``reasoning``, assistant ``message``,
    ``function_call``) ending at the item that carries the token-ID fields. Returns ``[]`` when
    no item carries token IDs (the rollout was collected without
    ``return_token_id_information``).

    Raises:
        TrainingDataError: naming the output item, when an item carries some but not all of
            the three fields, a field has the wrong type, the log-probs and generated IDs differ
            in length, a non-model item carries IDs, or some model items belong to a call that
            carries no IDs while others do (the trainer would silently lose or mis-mask them).
    """
    output = response.get("output")
    if not isinstance(output, list):
        raise TrainingDataError("response.output must be a list of items")
    for index, item in enumerate(output):
        if not isinstance(item, Mapping):
            raise TrainingDataError(f"response.output[{index}] must be an object, got {type(item).__name__}")
    if not any(item.get(name) is not None for item in output for name in TOKEN_ID_FIELDS):
        return []

    calls: list[ModelCall] = []
    pending: list[int] = []  # output indices of model items not yet closed by an item with IDs

    def unclosed_call_error() -> TrainingDataError:
        items = ", ".join(_describe(output[i], i) for i in pending)
        return TrainingDataError(
            f"{items}: model output without token IDs, while other model calls of this rollout carry "
            "them; every model call must carry prompt_token_ids, generation_token_ids and "
            "generation_log_probs on its last output item"
        )

    for index, item in enumerate(output):
        where = _describe(item, index)
        present = [name for name in TOKEN_ID_FIELDS if item.get(name) is not None]
        if not is_model_item(item):
            if present:
                raise TrainingDataError(f"{where} carries {present[0]}, but only model output items may")
            if pending:
                raise unclosed_call_error()
            continue
        pending.append(index)
        if not present:
            continue
        if len(present) != len(TOKEN_ID_FIELDS):
            missing = [name for name in TOKEN_ID_FIELDS if name not in present]
            raise TrainingDataError(
                f"{where} carries {', '.join(present)} without {', '.join(missing)}; a model call "
                "carries all three token-ID fields or none"
            )
        prompt = _int_list(item["prompt_token_ids"], where, "prompt_token_ids")
        generation = _int_list(item["generation_token_ids"], where, "generation_token_ids")
        log_probs = _float_list(item["generation_log_probs"], where, "generation_log_probs")
        if len(log_probs) != len(generation):
            raise TrainingDataError(
                f"{where} has {len(generation)} generation_token_ids but {len(log_probs)} "
                "generation_log_probs; they must align one to one"
            )
        flag = item.get("token_ids_contiguous")
        if flag is not None and not isinstance(flag, bool):
            raise TrainingDataError(f"{where}.token_ids_contiguous must be true, false or absent")
        calls.append(
            ModelCall(
                index=len(calls),
                output_index=index,
                item_types=tuple(str(output[i].get("type") or "message") for i in pending),
                prompt_token_ids=prompt,
                generation_token_ids=generation,
                generation_log_probs=log_probs,
                token_ids_contiguous=flag,
            )
        )
        pending = []
    if pending:
        raise unclosed_call_error()
    return calls


def _row_name(rollout: Mapping[str, Any]) -> str:
    indices = [f"{name}={rollout[name]}" for name in INDEX_FIELDS if name in rollout]
    return f"rollout ({', '.join(indices)})" if indices else "rollout"


def build_training_sequence(
    rollout: Mapping[str, Any], *, turn_end_token_ids: Iterable[int] | None = None
) -> TrainingSequence:
    """Lay a rollout's model calls end to end as one training sequence.

    For each call in order, the call's prompt must start with the sequence built so far
    (everything before it: earlier prompts' new context and generations). The part of the
    prompt beyond that is new context (tool results, user turns, role headers): mask 0,
    log-prob 0.0. The generation follows: mask 1 and its sampling log-probs. So a contiguous
    sequence equals the last call's ``prompt_token_ids + generation_token_ids``.

    A call breaks the sequence when its prompt does not extend it, or when the engine flagged
    the call ``token_ids_contiguous: false`` (the splice was refused; a response-level flag is
    read as the last call's, because an agent's final response keeps the last call's
    response fields). The first call never breaks: there is nothing before it. At a break the
    sequence **stops**: it holds the calls before the break, ``contiguous`` is False and
    ``break_at_call`` is the index of the call that did not extend it. Why stop rather than
    start a second sequence: a rollout is one sample with one reward, and group baselines
    (GRPO, RLOO) count samples, so splitting it would weigh a broken rollout twice; the prefix
    that is kept is exactly what the model saw, and the flag lets a trainer drop the row.

    ``turn_end_token_ids``: the engine may replace a sampled trailing turn-end token with the
    template's when several turn-end IDs are configured (``docs/TOKEN_IDS.md``). Pass the same
    IDs here to accept that one-token difference; the sequence then holds the template's token
    at that position, with mask 0 (the policy did not sample it). Without them, any difference
    breaks the sequence.

    Raises:
        TrainingDataError: naming the row (by ``_ng_task_index`` / ``_ng_rollout_index``) when
            it has no ``response``, no numeric ``reward``, no token IDs at all, or malformed
            token-ID fields (see :func:`model_calls`).
    """
    name = _row_name(rollout)
    response = rollout.get("response")
    if not isinstance(response, Mapping):
        raise TrainingDataError(f"{name} has no 'response' object; export verified rollouts, not input rows")
    reward = rollout.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise TrainingDataError(f"{name} has no numeric 'reward' (got {reward!r}); export verified rollouts")
    try:
        calls = model_calls(response)
    except TrainingDataError as exc:
        raise TrainingDataError(f"{name}: {exc}") from None
    if not calls:
        raise TrainingDataError(
            f"{name} carries no token IDs: no output item has prompt_token_ids / generation_token_ids / "
            "generation_log_probs; collect with return_token_id_information: true on the policy model"
        )

    turn_end = frozenset(turn_end_token_ids or ())
    response_flag = response.get("token_ids_contiguous")
    input_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    break_at: int | None = None
    replaced = 0
    for call in calls:
        prompt, known = call.prompt_token_ids, len(input_ids)
        if call.index > 0:
            flag = call.token_ids_contiguous
            if flag is None and call.index == len(calls) - 1:
                flag = response_flag if isinstance(response_flag, bool) else None
            if flag is False:
                break_at = call.index
                break
            if prompt[:known] != input_ids:
                if not _replaces_turn_end(prompt, input_ids, loss_mask, turn_end):
                    break_at = call.index
                    break
                # Same history; only the closing turn-end token differs. Keep the template's.
                input_ids[-1], loss_mask[-1], logprobs[-1] = prompt[known - 1], 0, 0.0
                replaced += 1
        new_context = len(prompt) - known
        input_ids += prompt[known:]
        loss_mask += [0] * new_context
        logprobs += [0.0] * new_context
        input_ids += call.generation_token_ids
        loss_mask += [1] * len(call.generation_token_ids)
        logprobs += call.generation_log_probs
    return TrainingSequence(
        input_ids=input_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        reward=float(reward),
        contiguous=break_at is None,
        num_calls=len(calls),
        break_at_call=break_at,
        replaced_turn_ends=replaced,
    )


def split_training_sequences(
    rollout: Mapping[str, Any], *, turn_end_token_ids: Iterable[int] | None = None
) -> list[TrainingSequence]:
    """A rollout as prefix-stable sequences: :func:`build_training_sequence`, and at each break
    a new sequence starting at the call that broke it (what a harness that rewrites its history
    can still train on, each sequence exactly what the model saw). One sequence when the rollout
    is contiguous; the ``break_at_call`` of each sequence but the last is the (rollout-wide)
    index of the call that starts the next. Raises as :func:`build_training_sequence`.
    """
    sequences: list[TrainingSequence] = []
    response = rollout.get("response")
    offset = 0
    while True:
        sequence = build_training_sequence(rollout, turn_end_token_ids=turn_end_token_ids)
        if sequence.break_at_call is None:
            sequences.append(sequence)
            return sequences
        sequences.append(dataclasses.replace(sequence, break_at_call=offset + sequence.break_at_call))
        assert isinstance(response, Mapping)  # build_training_sequence checked it
        calls = model_calls(response)
        start = calls[sequence.break_at_call - 1].output_index + 1
        offset += sequence.break_at_call
        response = {**response, "output": list(response["output"])[start:]}
        rollout = {**rollout, "response": response}


def _replaces_turn_end(
    prompt: Sequence[int], input_ids: Sequence[int], loss_mask: Sequence[int], turn_end: frozenset[int]
) -> bool:
    """Whether ``prompt`` extends ``input_ids`` except that the last token, a sampled turn end,
    became another turn-end token."""
    known = len(input_ids)
    return (
        bool(turn_end)
        and known > 0
        and loss_mask[-1] == 1  # the last token was sampled, so it ended a generation
        and input_ids[-1] in turn_end
        and len(prompt) >= known
        and prompt[known - 1] in turn_end
        and prompt[: known - 1] == input_ids[:-1]
    )


@dataclass
class ExportSummary:
    """What one export did. ``skipped`` lists ``(line number, reason)`` for rows not written."""

    rows: int = 0
    exported: int = 0
    contiguous: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)

    @property
    def non_contiguous(self) -> int:
        """Sequences written with ``contiguous: false``."""
        return self.exported - self.contiguous

    def line(self) -> str:
        """A one-line summary for the console."""
        return (
            f"rollouts: {self.rows}  exported: {self.exported}  contiguous: {self.contiguous}  "
            f"non-contiguous: {self.non_contiguous}  skipped: {len(self.skipped)}"
        )


def export_training_data(
    input_path: Path,
    output_path: Path,
    *,
    turn_end_token_ids: Iterable[int] | None = None,
    progress: bool = False,
) -> ExportSummary:
    """Convert a rollouts JSONL file into a training-sequences JSONL file, one row at a time.

    Each rollout becomes one line: :meth:`TrainingSequence.to_dict` plus the row's
    :data:`INDEX_FIELDS` when present. A line that is not JSON, or a rollout that cannot be
    converted, is skipped and reported with its line number; the others are still written.
    The output is written to a temporary file beside it and renamed at the end, so an
    interrupted export never leaves a partial file under the final name. ``progress`` shows a
    bar over the input's bytes on stderr.
    """
    from tqdm import tqdm

    summary = ExportSummary()
    turn_end = list(turn_end_token_ids or ())
    output_path.parent.mkdir(parents=True, exist_ok=True)
    partial = output_path.with_name(output_path.name + ".partial")
    bar = tqdm(
        total=input_path.stat().st_size, unit="B", unit_scale=True, desc="Exporting", disable=not progress
    )
    with input_path.open("rb") as source, partial.open("wb") as sink, bar:
        for line_number, line in enumerate(source, 1):
            bar.update(len(line))
            if not line.strip():
                continue
            summary.rows += 1
            try:
                rollout = orjson.loads(line)
                if not isinstance(rollout, dict):
                    raise TrainingDataError(f"a rollout must be a JSON object, got {type(rollout).__name__}")
                sequence = build_training_sequence(rollout, turn_end_token_ids=turn_end)
            except orjson.JSONDecodeError as exc:
                summary.skipped.append((line_number, f"not valid JSON: {exc}"))
                continue
            except TrainingDataError as exc:
                summary.skipped.append((line_number, str(exc)))
                continue
            record = sequence.to_dict()
            record.update({name: rollout[name] for name in INDEX_FIELDS if name in rollout})
            sink.write(orjson.dumps(record) + b"\n")
            summary.exported += 1
            summary.contiguous += sequence.contiguous
    os.replace(partial, output_path)
    return summary


def _export(argv: list[str]) -> int:
    config = load_config(argv)
    input_arg, output_arg = config.get("input_jsonl_fpath"), config.get("output_jsonl_fpath")
    if not input_arg or not Path(str(input_arg)).is_file():
        raise ConfigError(f"+input_jsonl_fpath must name an existing rollouts JSONL file, got {input_arg!r}")
    if not output_arg:
        raise ConfigError("+output_jsonl_fpath is required (where to write the training sequences)")
    turn_end = config.get("turn_end_token_ids")
    if turn_end is not None and (
        not isinstance(turn_end, list)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in turn_end)
    ):
        raise ConfigError(f"+turn_end_token_ids must be a list of integer token IDs, got {turn_end!r}")
    input_path, output_path = Path(str(input_arg)), Path(str(output_arg))
    summary = export_training_data(input_path, output_path, turn_end_token_ids=turn_end, progress=True)
    for line_number, reason in summary.skipped:
        sys.stderr.write(f"{input_path}:{line_number}: skipped: {reason}\n")
    print(summary.line())
    print(f"wrote {summary.exported} training sequences to {output_path}")
    # Skipping bad rows is the designed behaviour; only an export that produced nothing fails.
    return 1 if summary.rows and not summary.exported else 0


ng_export_training_data = console_command(_export, "ng_export_training_data")
