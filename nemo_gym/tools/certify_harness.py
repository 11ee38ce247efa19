"""``ng_certify_harness`` (``gym eval certify``): a certificate of RL fidelity for one harness on one engine.

It runs N rollouts of an agent (a harness: one of the CLI agents, harness_agent, simple_agent,
...) on a running stack with ``ng_collect_rollouts``, or reads rollouts already collected, and
checks, rollout by rollout and model call by model call, what a trainer relies on:

1. **Prefix stability**: each call's prompt token IDs begin with the previous call's prompt +
   generation. Where one does not, the break is named: the call, the token range where the two
   differ, the text on each side (decoded by the engine's ``/detokenize``) and the cause read off
   the chat template's role headers (:func:`break_cause`): ``a system turn inserted``,
   ``thinking removed``, ``a re-rendered template`` (a sampled assistant turn re-tokenized),
   ``a tool result reformatted``, ``a separate conversation`` (the harness started another
   history, e.g. a title request), ``history truncated``, or ``history rewritten``.
2. **Export**: the rollout is exported with :func:`nemo_gym.train_data.split_training_sequences`:
   one sequence per prefix-stable run of calls (one when the harness is prefix-stable; the
   report says how many otherwise).
3. **Loss mask**: in each sequence, the mask is 1 exactly on the tokens the policy sampled (each
   call's generation, at its place) and those tokens are the sampled ones.
4. **Log-probs**: the engine re-scores each sequence (vLLM's ``/v1/completions`` with
   ``prompt_logprobs``) and the sampled log-probs must be reproduced within ``logprob_tolerance``.

The verdict: ``token-exact`` (every rollout one sequence, every check passed),
``token-exact in split sequences`` (breaks, each named, but every exported sequence passes), or
``failed`` (a mask or log-prob mismatch, or rollouts without token IDs). The report is JSON,
with an HTML page beside it (:mod:`nemo_gym.tools.certificate_page`).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.collection.collection_io import iter_jsonl
from nemo_gym.console.command import console_command
from nemo_gym.launch.config import ConfigError, head_url_from_config, load_config
from nemo_gym.train_data import ModelCall, TrainingDataError, model_calls, split_training_sequences

DEFAULT_LOGPROB_TOLERANCE = 1e-3
"""Largest |sampled - re-scored| log-prob accepted: float32 on CPU differs by ~1e-5 between
incremental decoding and one forward pass; GPU engines in bf16 need a larger one (e.g. 0.05)."""
_CONTEXT_TOKENS = 24
_ROLE_HEADERS = (
    re.compile(r"<\|im_start\|>\s*(\w+)"),  # ChatML, Qwen
    re.compile(r"<\|start_header_id\|>\s*(\w+)\s*<\|end_header_id\|>"),  # Llama 3
    re.compile(r"<start_of_turn>\s*(\w+)"),  # Gemma
)

Decode = Callable[[Sequence[int]], str]
Score = Callable[[Sequence[int]], list[float]]


@dataclass
class PrefixBreak:
    """Where call ``call`` stops extending call ``call - 1``: ``token_range`` of the earlier
    sequence that the new prompt does not repeat, the text each side holds there, and the cause."""

    call: int
    token_range: list[int]
    cause: str
    expected_text: str
    got_text: str


@dataclass
class SequenceCheck:
    """One exported sequence: its calls, length, and the mask and log-prob checks."""

    calls: list[int]
    num_tokens: int
    sampled_tokens: int
    loss_mask_exact: bool
    loss_mask_problem: str | None = None
    max_logprob_diff: float | None = None
    logprobs_reproduced: bool | None = None


@dataclass
class RolloutCertificate:
    """The checks of one rollout."""

    index: int
    reward: Any
    num_calls: int
    prefix_stable: bool
    breaks: list[PrefixBreak] = field(default_factory=list)
    sequences: list[SequenceCheck] = field(default_factory=list)
    problem: str | None = None

    @property
    def passed(self) -> bool:
        """Every exported sequence has an exact mask and reproduced log-probs."""
        return self.problem is None and all(
            s.loss_mask_exact and s.logprobs_reproduced is not False for s in self.sequences
        )


def role_at(text: str) -> str | None:
    """The role of the chat-template turn the end of ``text`` lies in (its last role header)."""
    found: list[tuple[int, str]] = []
    for pattern in _ROLE_HEADERS:
        found += [(m.start(), m.group(1).lower()) for m in pattern.finditer(text)]
    return max(found)[1] if found else None


def break_cause(previous: ModelCall, call: ModelCall, at: int, decode: Decode) -> str:
    """Why ``call``'s prompt leaves the previous call's prompt + generation at token ``at``."""
    earlier = previous.prompt_token_ids + previous.generation_token_ids
    prompt = call.prompt_token_ids
    if at >= len(prompt):
        return "history truncated: the prompt is shorter than the history it should extend"
    got = decode(prompt[max(at - 4, 0) : at + _CONTEXT_TOKENS])
    if (
        role_at(got) == "system"
        and role_at(decode(earlier[max(at - 4, 0) : at + _CONTEXT_TOKENS])) != "system"
    ):
        return "a system turn inserted"
    if at >= len(previous.prompt_token_ids):
        sampled = decode(previous.generation_token_ids)
        if "<think>" in sampled or "</think>" in sampled:
            rest = decode(prompt[len(previous.prompt_token_ids) :])
            if "</think>" not in rest:
                return "thinking removed: the sampled reasoning is not in the next prompt"
        return "a re-rendered template: the sampled assistant turn was re-tokenized or re-formatted"
    role = role_at(decode(earlier[:at]))
    first_turn_end = next(
        (m.start() for p in _ROLE_HEADERS for m in p.finditer(decode(earlier[: at + 1])) if m.start() > 0),
        None,
    )
    if role == "system" or first_turn_end is None:
        return "a separate conversation: the system prompt or first turn differs (e.g. a title or routing request)"
    if role == "tool" or "<tool_response>" in decode(earlier[max(at - 64, 0) : at]):
        return "a tool result reformatted"
    if role == "assistant":
        return "a re-rendered template: an earlier assistant turn was rendered differently"
    return f"history rewritten in a {role or 'unknown'} turn"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where ``a`` and ``b`` differ (``min(len)`` when one is a prefix of the other)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def prefix_breaks(calls: Sequence[ModelCall], decode: Decode) -> list[PrefixBreak]:
    """The calls whose prompt does not extend the previous call's prompt + generation."""
    breaks = []
    for previous, call in zip(calls, calls[1:], strict=False):
        earlier = previous.prompt_token_ids + previous.generation_token_ids
        if call.prompt_token_ids[: len(earlier)] == earlier and call.token_ids_contiguous is not False:
            continue
        at = first_difference(earlier, call.prompt_token_ids)
        end = min(len(earlier), at + _CONTEXT_TOKENS)
        breaks.append(
            PrefixBreak(
                call=call.index,
                token_range=[at, len(earlier)],
                cause=break_cause(previous, call, at, decode),
                expected_text=decode(earlier[at:end]),
                got_text=decode(call.prompt_token_ids[at : at + _CONTEXT_TOKENS]),
            )
        )
    return breaks


def check_loss_mask(calls: Sequence[ModelCall], input_ids: list[int], loss_mask: list[int]) -> str | None:
    """None when the mask is 1 exactly on each call's generation at its place (and those tokens
    are the sampled ones); else what is wrong."""
    expected = [0] * len(input_ids)
    for call in calls:
        start = len(call.prompt_token_ids)
        stop = start + len(call.generation_token_ids)
        if stop > len(input_ids) or input_ids[start:stop] != call.generation_token_ids:
            return f"call {call.index}'s sampled tokens are not at positions {start}..{stop} of the sequence"
        expected[start:stop] = [1] * (stop - start)
    if loss_mask != expected:
        where = first_difference(loss_mask, expected)
        return f"the loss mask differs from the sampled positions at token {where}"
    return None


def certify_rollout(
    index: int, rollout: Mapping[str, Any], decode: Decode, score: Score | None, tolerance: float
) -> RolloutCertificate:
    """All checks of one rollout (see the module doc)."""
    response = rollout.get("response") or {}
    try:
        calls = model_calls(response)
        sequences = split_training_sequences(rollout) if calls else []
    except TrainingDataError as exc:
        return RolloutCertificate(index, rollout.get("reward"), 0, False, problem=str(exc))
    if not calls:
        return RolloutCertificate(
            index, rollout.get("reward"), 0, False, problem="no model call carries token IDs"
        )
    breaks = prefix_breaks(calls, decode)
    certificate = RolloutCertificate(index, rollout.get("reward"), len(calls), not breaks, breaks)
    starts = [0, *(s.break_at_call for s in sequences if s.break_at_call is not None), len(calls)]
    for sequence, start, stop in zip(sequences, starts, starts[1:], strict=False):
        own = calls[start:stop]
        problem = check_loss_mask(own, sequence.input_ids, sequence.loss_mask)
        check = SequenceCheck(
            calls=[c.index for c in own],
            num_tokens=len(sequence.input_ids),
            sampled_tokens=sum(sequence.loss_mask),
            loss_mask_exact=problem is None,
            loss_mask_problem=problem,
        )
        if score is not None:
            rescored = score(sequence.input_ids)
            diffs = [
                abs(rescored[i - 1] - sequence.logprobs[i])
                for i, m in enumerate(sequence.loss_mask)
                if m and i > 0
            ]
            check.max_logprob_diff = max(diffs, default=0.0)
            check.logprobs_reproduced = check.max_logprob_diff <= tolerance
        certificate.sequences.append(check)
    return certificate


def verdict_of(rollouts: Sequence[RolloutCertificate]) -> str:
    """``token-exact``, ``token-exact in split sequences`` or ``failed`` (see the module doc)."""
    if not rollouts or not all(r.passed for r in rollouts):
        return "failed"
    if all(r.prefix_stable for r in rollouts):
        return "token-exact"
    return "token-exact in split sequences"


def build_report(
    harness: str, engine: str, rollouts: Sequence[RolloutCertificate], tolerance: float
) -> dict[str, Any]:
    """The certificate as a JSON-ready dict."""
    causes: dict[str, int] = {}
    for rollout in rollouts:
        for item in rollout.breaks:
            causes[item.cause] = causes.get(item.cause, 0) + 1
    diffs = [s.max_logprob_diff for r in rollouts for s in r.sequences if s.max_logprob_diff is not None]
    return {
        "harness": harness,
        "engine": engine,
        "verdict": verdict_of(rollouts),
        "num_rollouts": len(rollouts),
        "prefix_stable_rollouts": sum(r.prefix_stable for r in rollouts),
        "sequences_exported": sum(len(r.sequences) for r in rollouts),
        "split": any(len(r.sequences) > 1 for r in rollouts),
        "break_causes": causes,
        "loss_mask_exact": all(s.loss_mask_exact for r in rollouts for s in r.sequences),
        "logprob_tolerance": tolerance,
        "max_logprob_diff": max(diffs, default=None),
        "rescored": bool(diffs),
        "rollouts": [asdict(r) | {"passed": r.passed} for r in rollouts],
    }


# ---- the engine: detokenize and score over HTTP ------------------------------------------


class Engine:
    """The engine's ``/detokenize`` and scoring ``/v1/completions``, by server name or base URL."""

    def __init__(self, *, server: str | None, base_url: str | None, head_url: str, model: str | None) -> None:
        self.server, self.base_url, self.head_url, self.model = server, base_url, head_url, model
        self._cache: dict[tuple[int, ...], str] = {}

    def label(self) -> str:
        """How the report names the engine."""
        return self.server or self.base_url or "none"

    def _url(self) -> str:
        if self.base_url is None:
            from nemo_gym.serving.server_client import ServerClient

            async def resolve() -> str:
                return await ServerClient(self.head_url).base_url(str(self.server))

            self.base_url = asyncio.run(resolve()).rstrip("/")
        return self.base_url

    def call(self, path: str, body: dict[str, Any]) -> Any:
        """One POST to the engine; an error answer raises :class:`ConfigError` naming it."""
        request = urllib.request.Request(
            self._url() + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return orjson.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ConfigError(
                f"engine {self.label()} answered {path} with HTTP {exc.code}: {detail}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens kept)."""
        key = tuple(ids)
        if not key:
            return ""
        if key not in self._cache:
            self._cache[key] = str(self.call("/detokenize", {"tokens": list(ids)}).get("prompt", ""))
        return self._cache[key]

    def score(self, ids: Sequence[int]) -> list[float]:
        """``log p(ids[i] | ids[:i])`` for ``i >= 1``."""
        body: dict[str, Any] = {"prompt": list(ids), "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
        if self.model:
            body["model"] = self.model
        entries = self.call("/v1/completions", body)["choices"][0]["prompt_logprobs"]
        return [
            float(entry[str(token)]["logprob"]) for token, entry in zip(ids[1:], entries[1:], strict=True)
        ]


def collect(config: Mapping[str, Any], rows: Path, agent: str, out: Path) -> None:
    """N rollouts of ``agent`` on the running stack, by ``ng_collect_rollouts`` in a child process."""
    argv = [
        f"++head_server.host={(config.get('head_server') or {}).get('host', '127.0.0.1')}",
        f"++head_server.port={(config.get('head_server') or {}).get('port', 11000)}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={rows}",
        f"+output_jsonl_fpath={out}",
        f"+limit={int(config.get('limit') or 1)}",
        f"+num_repeats={int(config.get('num_rollouts') or 3)}",
    ]
    code = "import sys; from nemo_gym.rollout_collection import ng_collect_rollouts as c; c(sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", code, *argv], check=False)
    if done.returncode not in (0, 3):  # 3: some rollouts failed; the certificate counts what finished
        raise ConfigError(f"ng_collect_rollouts failed with exit code {done.returncode}")


def certify(config: Mapping[str, Any]) -> int:
    """Run the command on a loaded config; 0 unless the verdict is ``failed``."""
    from nemo_gym.tools.certificate_page import write_page

    rollouts_arg = config.get("rollouts_jsonl_fpath")
    agent = config.get("agent_name")
    if not rollouts_arg:
        rows = config.get("input_jsonl_fpath")
        if not (rows and agent):
            raise ConfigError(
                "give +rollouts_jsonl_fpath=PATH (rollouts already collected), or +input_jsonl_fpath=ROWS "
                "and +agent_name=NAME to collect +num_rollouts rollouts on the running stack first"
            )
        output_dir = Path(str(config.get("output_dir") or "results/certificate"))
        output_dir.mkdir(parents=True, exist_ok=True)
        rollouts_path = output_dir / "rollouts.jsonl"
        rollouts_path.unlink(missing_ok=True)
        collect(config, Path(str(rows)), str(agent), rollouts_path)
    else:
        rollouts_path = Path(str(rollouts_arg))
    if not rollouts_path.is_file():
        raise ConfigError(f"no rollouts file at {rollouts_path}")
    engine_server, engine_url = config.get("engine_server"), config.get("engine_base_url")
    if not (engine_server or engine_url):
        raise ConfigError(
            "name the engine: +engine_server=NAME (through the head server) or +engine_base_url=URL"
        )
    tolerance = float(config.get("logprob_tolerance") or DEFAULT_LOGPROB_TOLERANCE)
    engine = Engine(
        server=str(engine_server) if engine_server else None,
        base_url=str(engine_url).rstrip("/") if engine_url else None,
        head_url=head_url_from_config(config),
        model=config.get("engine_model"),
    )
    score = None if config.get("rescore") is False else engine.score
    certificates = [
        certify_rollout(index, row, engine.decode, score, tolerance)
        for index, (_, row) in enumerate(iter_jsonl(rollouts_path))
    ]
    harness = str(config.get("harness") or agent or rollouts_path.stem)
    report = build_report(harness, engine.label(), certificates, tolerance)
    output = Path(str(config.get("output_json_fpath") or rollouts_path.with_suffix(".certificate.json")))
    output.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    page = write_page(report, output.with_suffix(".html"))
    print(
        f"{harness} on {engine.label()}: {report['verdict']} ({report['num_rollouts']} rollouts, "
        f"{report['prefix_stable_rollouts']} prefix-stable, {report['sequences_exported']} sequences, "
        f"loss mask exact: {report['loss_mask_exact']}, max |logprob diff| {report['max_logprob_diff']} "
        f"<= {tolerance})"
    )
    for cause, count in report["break_causes"].items():
        print(f"  break x{count}: {cause}")
    print(f"wrote {output} and {page}")
    return 1 if report["verdict"] == "failed" else 0


def _certify_command(argv: list[str]) -> int:
    return certify(load_config(argv, validate_refs=False))


ng_certify_harness = console_command(_certify_command, "ng_certify_harness")
