"""Training sequences from rollouts whose token IDs come from a real tokenizer and the real splice.

Each simulated rollout goes the way a real one does: the agent's items are converted to Chat
Completions messages (``nemo_gym.models.conversion``), the engine's prompt is the splice of those
messages (``nemo_gym.models.token_ids``) over a tiny locally built tokenizer, the "sampled" IDs are a
text encoded in pieces (so they drift from what the template would re-tokenize), and the IDs
ride on the last output item of each call, as model servers return them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from transformers import PreTrainedTokenizerFast

from nemo_gym.engine.tiny_tokenizer import build_tiny_tokenizer, turn_end_token_ids
from nemo_gym.models.conversion import responses_to_chat_request
from nemo_gym.models.token_ids import render_chat_token_ids, spliced_prompt_token_ids
from nemo_gym.response_items import (
    build_response,
    function_call_item,
    function_call_output_item,
    message_item,
)
from nemo_gym.train_data import (
    TrainingDataError,
    build_training_sequence,
    export_training_data,
    model_calls,
    ng_export_training_data,
)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}


@functools.cache
def tiny(template: str) -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer(template)


def sampled(tokenizer: PreTrainedTokenizerFast, text: str, piece: int = 7) -> list[int]:
    """IDs as a sampler might emit them: the text encoded in fixed-size pieces, not as a whole."""
    return [
        token_id
        for start in range(0, len(text), piece)
        for token_id in tokenizer.encode(text[start : start + piece], add_special_tokens=False)
    ]


def tool_call_text(template: str, city: str) -> str:
    if template == "llama3":
        return json.dumps({"name": "get_weather", "parameters": {"city": city}}, separators=(",", ":"))
    payload = json.dumps({"name": "get_weather", "arguments": {"city": city}}, separators=(",", ":"))
    return f"<tool_call>\n{payload}\n</tool_call>"


@dataclass
class Simulated:
    row: dict[str, Any]
    prompts: list[list[int]]
    generations: list[list[int]]
    log_probs: list[list[float]]


def simulate_tool_rollout(template: str, edit_prompt: Any = None) -> Simulated:
    """Three model calls: a tool call, a message plus a tool call, the final answer.

    ``edit_prompt(call_index, messages, prompt) -> prompt`` may replace a prompt before the
    "engine" generates from it, to break the rollout on purpose.
    """
    tokenizer = tiny(template)
    (eos,) = turn_end_token_ids(tokenizer)
    params: dict[str, Any] = {
        "input": [{"type": "message", "role": "user", "content": "What is the weather in Paris and Oslo?"}],
        "tools": [WEATHER_TOOL],
    }
    plans: list[tuple[list[dict[str, Any]], str]] = [
        (
            [function_call_item("get_weather", '{"city": "Paris"}', "call_1")],
            tool_call_text(template, "Paris"),
        ),
        (
            [message_item("Now Oslo."), function_call_item("get_weather", '{"city": "Oslo"}', "call_2")],
            "Now Oslo.\n" + tool_call_text(template, "Oslo"),
        ),
        ([message_item("Paris is sunny and Oslo is cold.")], "Paris is sunny and Oslo is cold."),
    ]
    if template == "qwen3":
        reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call the tool."}]}
        plans[0] = ([reasoning, *plans[0][0]], "<think>\nCall the tool.\n</think>\n\n" + plans[0][1])
    tool_results = {"call_1": '{"temperature": 20, "condition": "sunny"}', "call_2": '{"temperature": -3}'}

    produced: list[dict[str, Any]] = []
    sim = Simulated(row={}, prompts=[], generations=[], log_probs=[])
    for call_index, (items, text) in enumerate(plans):
        chat = responses_to_chat_request({**params, "input": params["input"] + produced})
        prompt, contiguous = spliced_prompt_token_ids(chat["messages"], tokenizer, tools=chat["tools"])
        assert contiguous
        if edit_prompt is not None:
            prompt = edit_prompt(call_index, chat, prompt)
        generation = sampled(tokenizer, text) + [eos]
        log_probs = [-round(0.1 * (call_index + 1) + 0.001 * i, 6) for i in range(len(generation))]
        items[-1].update(
            prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=log_probs
        )
        produced += items
        for item in items:
            if item["type"] == "function_call":
                produced.append(function_call_output_item(item["call_id"], tool_results[item["call_id"]]))
        sim.prompts.append(prompt)
        sim.generations.append(generation)
        sim.log_probs.append(log_probs)
    sim.row = {
        "responses_create_params": params,
        "expected_answer": "sunny",
        "response": build_response(produced, params, model="tiny"),
        "reward": 1.0,
        "_ng_task_index": 4,
        "_ng_rollout_index": 1,
    }
    return sim


def expected_mask_and_logprobs(sim: Simulated, calls: int) -> tuple[list[int], list[float]]:
    length = len(sim.prompts[calls - 1]) + len(sim.generations[calls - 1])
    mask, logprobs = [0] * length, [0.0] * length
    for prompt, generation, log_probs in zip(
        sim.prompts[:calls], sim.generations, sim.log_probs, strict=False
    ):
        start = len(prompt)
        mask[start : start + len(generation)] = [1] * len(generation)
        logprobs[start : start + len(generation)] = log_probs
    return mask, logprobs


def spans(mask: Sequence[int], value: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of ``value`` in ``mask``."""
    runs, start = [], None
    for position, bit in enumerate([*mask, None]):
        if bit == value and start is None:
            start = position
        elif bit != value and start is not None:
            runs.append((start, position))
            start = None
    return runs


# ------------------------------------------------------------------ contiguous rollouts


@pytest.mark.parametrize("template", ["chatml", "qwen3", "llama3"])
def test_three_call_tool_rollout_becomes_one_masked_sequence(template: str) -> None:
    sim = simulate_tool_rollout(template)
    tokenizer = tiny(template)
    sequence = build_training_sequence(sim.row)

    assert sequence.contiguous and sequence.break_at_call is None
    assert sequence.num_calls == 3 and sequence.reward == 1.0
    assert sequence.input_ids == sim.prompts[-1] + sim.generations[-1]
    assert len(sequence.input_ids) == len(sequence.loss_mask) == len(sequence.logprobs)
    # Every call's prompt is a prefix of the sequence (what the model saw is what we train on).
    for prompt, generation in zip(sim.prompts, sim.generations, strict=True):
        assert sequence.input_ids[: len(prompt) + len(generation)] == prompt + generation

    mask, logprobs = expected_mask_and_logprobs(sim, 3)
    assert sequence.loss_mask == mask
    assert sequence.logprobs == logprobs
    assert sum(sequence.loss_mask) == sum(len(g) for g in sim.generations)

    # Sampled runs are exactly the three generations; between them lie the tool results.
    sampled_runs = spans(sequence.loss_mask, 1)
    assert [sequence.input_ids[a:b] for a, b in sampled_runs] == sim.generations
    context_runs = spans(sequence.loss_mask, 0)
    assert len(context_runs) == 3  # the first prompt, then one tool turn before each later call
    first_tool_turn = tokenizer.decode(sequence.input_ids[slice(*context_runs[1])])
    second_tool_turn = tokenizer.decode(sequence.input_ids[slice(*context_runs[2])])
    assert "sunny" in first_tool_turn and "Paris" not in first_tool_turn
    assert '{"temperature": -3}' in second_tool_turn
    # The sampled text is in the sequence as sampled (compact JSON), not as the template re-renders it.
    assert tool_call_text(template, "Oslo") in tokenizer.decode(sequence.input_ids[slice(*sampled_runs[1])])


def test_model_calls_group_items_and_read_the_ids_in_order() -> None:
    sim = simulate_tool_rollout("qwen3")
    calls = model_calls(sim.row["response"])
    assert [call.item_types for call in calls] == [
        ("reasoning", "function_call"),
        ("message", "function_call"),
        ("message",),
    ]
    types = [item["type"] for item in sim.row["response"]["output"]]
    assert [call.output_index for call in calls] == [1, 4, 6]
    assert types[2] == types[5] == "function_call_output"
    assert [call.prompt_token_ids for call in calls] == sim.prompts
    assert [call.generation_log_probs for call in calls] == sim.log_probs
    assert all(call.token_ids_contiguous is None for call in calls)


def test_single_call_rollout_and_a_generation_cut_by_max_tokens() -> None:
    tokenizer = tiny("chatml")
    messages = [{"role": "user", "content": "Describe the jeans."}]
    prompt = render_chat_token_ids(messages, tokenizer)
    generation = sampled(tokenizer, "Skinny jeans, skinny")  # no turn end: cut by max_tokens
    item = message_item("Skinny jeans, skinny")
    item.update(
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-1.0] * len(generation),
    )
    row = {"response": build_response([item], {}, model="tiny", status="incomplete"), "reward": 0}
    sequence = build_training_sequence(row)
    assert sequence.contiguous and sequence.num_calls == 1 and sequence.reward == 0.0
    assert sequence.input_ids == prompt + generation
    assert sequence.loss_mask == [0] * len(prompt) + [1] * len(generation)


# ------------------------------------------------------------------ broken rollouts


def plain_render_for_call(target: int) -> Any:
    """A prompt edit: the engine fell back to the plain render (the splice was not applied)."""

    def edit(call_index: int, chat: dict[str, Any], prompt: list[int]) -> list[int]:
        if call_index != target:
            return prompt
        return render_chat_token_ids(chat["messages"], tiny("chatml"), tools=chat["tools"])

    return edit


def test_prompt_that_does_not_extend_the_sequence_stops_it() -> None:
    sim = simulate_tool_rollout("chatml", edit_prompt=plain_render_for_call(1))
    # The plain render re-tokenizes call 0's compact JSON differently: it does not extend.
    first = sim.prompts[0] + sim.generations[0]
    assert sim.prompts[1][: len(first)] != first

    sequence = build_training_sequence(sim.row)
    assert not sequence.contiguous
    assert sequence.break_at_call == 1 and sequence.num_calls == 3
    # The sequence keeps exactly the calls before the break, nothing glued after it.
    assert sequence.input_ids == first
    mask, logprobs = expected_mask_and_logprobs(sim, 1)
    assert sequence.loss_mask == mask and sequence.logprobs == logprobs


def test_break_at_the_last_call_keeps_the_first_two() -> None:
    sim = simulate_tool_rollout("chatml", edit_prompt=plain_render_for_call(2))
    sequence = build_training_sequence(sim.row)
    assert not sequence.contiguous and sequence.break_at_call == 2
    assert sequence.input_ids == sim.prompts[1] + sim.generations[1]
    assert sum(sequence.loss_mask) == len(sim.generations[0]) + len(sim.generations[1])


def test_an_edited_token_in_the_middle_of_a_prompt_breaks_it() -> None:
    def edit(call_index: int, chat: dict[str, Any], prompt: list[int]) -> list[int]:
        return prompt if call_index != 2 else [*prompt[:5], prompt[5] + 1, *prompt[6:]]

    sequence = build_training_sequence(simulate_tool_rollout("chatml", edit_prompt=edit).row)
    assert not sequence.contiguous and sequence.break_at_call == 2


def test_engine_flag_breaks_even_when_the_ids_line_up() -> None:
    sim = simulate_tool_rollout("chatml")
    calls = model_calls(sim.row["response"])
    sim.row["response"]["output"][calls[2].output_index]["token_ids_contiguous"] = False
    sequence = build_training_sequence(sim.row)
    assert not sequence.contiguous and sequence.break_at_call == 2
    assert sequence.input_ids == sim.prompts[1] + sim.generations[1]

    # An explicit True on the item is just the default.
    sim.row["response"]["output"][calls[2].output_index]["token_ids_contiguous"] = True
    assert build_training_sequence(sim.row).contiguous


def test_response_level_flag_is_the_last_calls_and_never_breaks_the_first() -> None:
    sim = simulate_tool_rollout("chatml")
    sim.row["response"]["token_ids_contiguous"] = False
    sequence = build_training_sequence(sim.row)
    assert not sequence.contiguous and sequence.break_at_call == 2

    # The first call has nothing to be discontiguous with.
    output = sim.row["response"]["output"]
    calls = model_calls(sim.row["response"])
    output[calls[0].output_index]["token_ids_contiguous"] = False
    del sim.row["response"]["token_ids_contiguous"]
    assert build_training_sequence(sim.row).contiguous


def test_a_replaced_turn_end_is_accepted_only_with_the_turn_end_ids() -> None:
    # Synthetic IDs: 97 and 99 both end a turn; the model stopped on 97, the template writes 99.
    first = message_item("a")
    first.update(prompt_token_ids=[1, 2], generation_token_ids=[3, 97], generation_log_probs=[-0.1, -0.2])
    second = message_item("b")
    second.update(
        prompt_token_ids=[1, 2, 3, 99, 5, 6], generation_token_ids=[7, 99], generation_log_probs=[-0.3, -0.4]
    )
    row = {"response": build_response([first, second], {}, model="m"), "reward": 1.0}

    strict = build_training_sequence(row)
    assert not strict.contiguous and strict.break_at_call == 1

    sequence = build_training_sequence(row, turn_end_token_ids=[97, 99])
    assert sequence.contiguous and sequence.replaced_turn_ends == 1
    assert sequence.input_ids == [1, 2, 3, 99, 5, 6, 7, 99]
    # The template's turn end was not sampled: it is masked out with its log-prob.
    assert sequence.loss_mask == [0, 0, 1, 0, 0, 0, 1, 1]
    assert sequence.logprobs == [0.0, 0.0, -0.1, 0.0, 0.0, 0.0, -0.3, -0.4]

    # A difference anywhere but that one sampled turn end still breaks.
    second["prompt_token_ids"] = [1, 2, 4, 99, 5, 6]
    assert build_training_sequence(row, turn_end_token_ids=[97, 99]).break_at_call == 1


# ------------------------------------------------------------------ rows that cannot be converted


def id_fields(prompt: list[int], generation: list[int]) -> dict[str, Any]:
    return {
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ([message_item("hi")], "carries no token IDs"),
        (
            [{**message_item("hi"), "prompt_token_ids": [1], "generation_token_ids": [2]}],
            r"output\[0\] \(message\) carries prompt_token_ids, generation_token_ids without generation_log_probs",
        ),
        (
            [{**message_item("hi"), **id_fields([1], [2, 3]), "generation_log_probs": [-1.0]}],
            "2 generation_token_ids but 1 generation_log_probs",
        ),
        (
            [{**message_item("hi"), **id_fields([1], [2]), "prompt_token_ids": "1 2"}],
            r"output\[0\] \(message\).prompt_token_ids must be a list of integer token IDs",
        ),
        (
            [
                function_call_item("f", "{}", "c1"),
                function_call_output_item("c1", "ok"),
                {**message_item("done"), **id_fields([1], [2])},
            ],
            r"output\[0\] \(function_call\): model output without token IDs",
        ),
        (
            [{**message_item("hi"), **id_fields([1], [2])}, message_item("more")],
            r"output\[1\] \(message\): model output without token IDs",
        ),
        (
            [{**function_call_output_item("c", "x"), **id_fields([1], [2])}],
            r"output\[0\] \(function_call_output\) carries prompt_token_ids, but only model output items may",
        ),
    ],
)
def test_bad_token_fields_name_the_row_and_the_item(output: list[dict[str, Any]], message: str) -> None:
    row = {"response": {"output": output}, "reward": 1.0, "_ng_task_index": 7, "_ng_rollout_index": 0}
    with pytest.raises(
        TrainingDataError, match=r"rollout \(_ng_task_index=7, _ng_rollout_index=0\)"
    ) as caught:
        build_training_sequence(row)
    assert caught.match(message)


def test_rows_without_response_or_reward_are_refused() -> None:
    with pytest.raises(TrainingDataError, match="no 'response' object"):
        build_training_sequence({"responses_create_params": {"input": "hi"}})
    item = {**message_item("hi"), **id_fields([1], [2])}
    with pytest.raises(TrainingDataError, match="no numeric 'reward'"):
        build_training_sequence({"response": {"output": [item]}})
    with pytest.raises(TrainingDataError, match="no numeric 'reward'"):
        build_training_sequence({"response": {"output": [item]}, "reward": True})


# ------------------------------------------------------------------ the command


def test_export_command_writes_sequences_and_reports_bad_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray env.yaml from the working directory
    good = simulate_tool_rollout("chatml")
    broken = simulate_tool_rollout("chatml", edit_prompt=plain_render_for_call(1))
    without_ids = {"responses_create_params": {"input": "hi"}, "response": {"output": [message_item("hi")]}}
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(
        b"".join(
            [
                orjson.dumps(good.row) + b"\n",
                b'{"reward": 1.0, "response": \n',  # line 2: truncated JSON
                b"\n",  # blank lines are not rows
                orjson.dumps({**without_ids, "reward": 0.0, "_ng_task_index": 9}) + b"\n",  # line 4
                orjson.dumps({**broken.row, "_ng_rollout_index": 3}) + b"\n",  # line 5
            ]
        )
    )
    out = tmp_path / "out" / "sequences.jsonl"

    with pytest.raises(SystemExit) as exit_info:
        ng_export_training_data([f"+input_jsonl_fpath={rollouts}", f"+output_jsonl_fpath={out}"])
    assert exit_info.value.code == 0
    captured = capsys.readouterr()
    assert "rollouts: 4  exported: 2  contiguous: 1  non-contiguous: 1  skipped: 2" in captured.out
    assert f"{rollouts}:2: skipped: not valid JSON" in captured.err
    assert f"{rollouts}:4: skipped: rollout (_ng_task_index=9) carries no token IDs" in captured.err
    assert ":1:" not in captured.err and ":5:" not in captured.err

    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["input_ids"] == good.prompts[-1] + good.generations[-1]
    assert first["loss_mask"] == expected_mask_and_logprobs(good, 3)[0]
    assert first["logprobs"] == expected_mask_and_logprobs(good, 3)[1]
    assert (first["reward"], first["contiguous"], first["num_calls"], first["break_at_call"]) == (
        1.0,
        True,
        3,
        None,
    )
    assert (first["_ng_task_index"], first["_ng_rollout_index"]) == (4, 1)
    assert (second["contiguous"], second["break_at_call"], second["_ng_rollout_index"]) == (False, 1, 3)
    assert second["input_ids"] == broken.prompts[0] + broken.generations[0]
    assert not list(out.parent.glob("*.partial"))


def test_export_reports_missing_input_and_all_bad_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sequences.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        ng_export_training_data(
            [f"+input_jsonl_fpath={tmp_path / 'missing.jsonl'}", f"+output_jsonl_fpath={out}"]
        )
    assert exit_info.value.code == 2
    assert "+input_jsonl_fpath must name an existing rollouts JSONL file" in capsys.readouterr().err

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text('[1, 2]\n{"response": {"output": []}, "reward": 1}\n')
    with pytest.raises(SystemExit) as exit_info:
        ng_export_training_data([f"+input_jsonl_fpath={rollouts}", f"+output_jsonl_fpath={out}"])
    assert exit_info.value.code == 1  # nothing could be exported
    err = capsys.readouterr().err
    assert ":1: skipped: a rollout must be a JSON object, got list" in err
    assert ":2: skipped: rollout carries no token IDs" in err
    assert out.read_bytes() == b""


def test_export_function_accepts_turn_end_ids(tmp_path: Path) -> None:
    first = {**message_item("a"), **id_fields([1], [3, 97])}
    second = {**message_item("b"), **id_fields([1, 3, 99, 5], [7])}
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_bytes(orjson.dumps({"response": {"output": [first, second]}, "reward": 0.5}) + b"\n")
    summary = export_training_data(rollouts, tmp_path / "s.jsonl", turn_end_token_ids=[97, 99])
    assert (summary.rows, summary.exported, summary.contiguous, summary.skipped) == (1, 1, 1, [])
    (record,) = [orjson.loads(line) for line in (tmp_path / "s.jsonl").read_bytes().splitlines()]
    assert record["input_ids"] == [1, 3, 99, 5, 7] and record["loss_mask"] == [0, 1, 0, 0, 1]
    assert "_ng_task_index" not in record
