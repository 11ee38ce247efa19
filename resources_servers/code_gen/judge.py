"""Grading a model's program: find its code, run it on every test case, compare the outputs.

Test cases come in NeMo Gym's (LiveCodeBench's) shape: ``{"inputs": [...], "outputs": [...],
"fn_name": null | "name"}``. Without ``fn_name`` each input is the program's stdin and the
matching output its expected stdout. With ``fn_name`` each input holds one JSON value per line
(the call's arguments) and each output one JSON value (the expected return value).

Per-test codes in ``result`` (the LiveCodeBench convention): ``True`` passed, ``-1`` the code
does not compile, ``-2`` wrong answer, ``-3`` time limit, ``-4`` runtime error (exception,
crash, memory, output limit, missing function).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import zlib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, model_validator

from resources_servers.code_gen.sandbox import INFRASTRUCTURE_STATUSES, CodeSandbox, RunResult, RunStatus

COMPILE_ERROR, WRONG_ANSWER, TIME_LIMIT, RUNTIME_ERROR = -1, -2, -3, -4
_PYTHON_TAGS = {"python", "python3", "py", "py3"}
_OPENING_FENCE = re.compile(r"^\s*```\s*([A-Za-z0-9_+\-.]*)\s*$")
_CLOSING_FENCE = re.compile(r"^\s*```\s*$")
_SHOWN_CHARS = 1000


class UnitTests(BaseModel):
    """A row's ``verifier_metadata.unit_tests``; NeMo Gym's compressed form is unpacked."""

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _unpack(cls, value: Any) -> Any:
        # NeMo Gym may store tests as {"packed": base64(zlib(json({"inputs", "outputs"})))}.
        if isinstance(value, dict) and "packed" in value:
            try:
                decoded = json.loads(zlib.decompress(base64.b64decode(value["packed"])))
                inputs, outputs = decoded["inputs"], decoded["outputs"]
            except (ValueError, TypeError, KeyError, zlib.error) as exc:
                raise ValueError(f"packed: not base64(zlib(JSON with inputs and outputs)): {exc}") from exc
            return {"inputs": inputs, "outputs": outputs, "fn_name": value.get("fn_name")}
        return value

    @model_validator(mode="after")
    def _same_length(self) -> UnitTests:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if not self.inputs:
            raise ValueError("no test cases")
        return self


@dataclass
class GradeReport:
    """The outcome over all test cases: per-test codes, details of the first failure, a reason."""

    passed: bool
    result: list[bool | int]
    metadata: dict[str, Any]
    reason: str
    time_s: float = 0.0
    runs: list[RunResult] = field(default_factory=list, repr=False)
    # Set when no test failed for the code's own reasons but one ended for the machine's (the
    # sandbox failed, or the program waited past its deadline for a CPU): not a verdict.
    infrastructure: RunResult | None = None


def extract_python_code(text: str) -> str | None:
    """The body of the last fenced block tagged python (or, failing that, the last untagged one).

    Blocks that are never closed (a truncated answer) are ignored.
    """
    tagged: list[str] = []
    untagged: list[str] = []
    language: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if language is None:
            opening = _OPENING_FENCE.match(line)
            if opening:
                language, body = opening.group(1).lower(), []
        elif _CLOSING_FENCE.match(line):
            if language in _PYTHON_TAGS:
                tagged.append("\n".join(body))
            elif language == "":
                untagged.append("\n".join(body))
            language = None
        else:
            body.append(line)
    blocks = tagged or untagged
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]


def compare_stdout(output: str, expected: str) -> tuple[bool, str]:
    """Line-by-line comparison: whitespace around the text and each line is ignored; a line also
    matches when its whitespace-separated tokens are equal as decimal numbers."""
    got, want = _stripped_lines(output), _stripped_lines(expected)
    if len(got) != len(want):
        return False, "Wrong answer: mismatched output length"
    for index, (got_line, want_line) in enumerate(zip(got, want, strict=True)):
        if got_line == want_line:
            continue
        got_numbers, want_numbers = _decimals(got_line), _decimals(want_line)
        if got_numbers is not None and got_numbers == want_numbers:
            continue
        return False, f"Wrong answer at output_line_idx={index}: {_short(got_line)} != {_short(want_line)}"
    return True, ""


def compare_return_value(output: str, expected: str) -> tuple[bool, str]:
    """Compare the JSON return value printed by a function-call run with the expected JSON."""
    try:
        want = json.loads(expected)
    except json.JSONDecodeError:
        return False, f"expected output is not JSON: {_short(expected)}"
    try:
        got = json.loads(output)
    except json.JSONDecodeError:
        return False, f"return value is not JSON: {_short(output)}"
    if got == want:
        return True, ""
    return False, f"Wrong answer: {_short(json.dumps(got))} != {_short(json.dumps(want))}"


def parse_call_arguments(raw: str) -> list[Any]:
    """Function-call inputs: one JSON value per line."""
    return [json.loads(line) for line in raw.split("\n") if line.strip()]


async def grade(
    sandbox: CodeSandbox, code: str, tests: UnitTests, *, stop_on_first_failure: bool = True
) -> GradeReport:
    """Run ``code`` on every test case (concurrently, bounded by the sandbox) and judge it.

    With ``stop_on_first_failure``, tests that have not started when one fails are skipped;
    ``result`` lists codes up to and including the first failure, as NeMo Gym does.
    """
    started = time.monotonic()
    failed = asyncio.Event()
    call_args: list[list[Any]] = []
    if tests.fn_name:
        for index, raw_input in enumerate(tests.inputs):
            try:
                call_args.append(parse_call_arguments(raw_input))
            except json.JSONDecodeError as exc:
                message = f"test input {index} is not one JSON value per line: {exc}"
                metadata = {
                    "inputs": _short(raw_input),
                    "error_code": RUNTIME_ERROR,
                    "error_message": message,
                }
                return GradeReport(False, [RUNTIME_ERROR], metadata, f"bad test data: {message}")

    async def one(index: int) -> tuple[bool | int, str, RunResult]:
        skip = failed if stop_on_first_failure else None
        if tests.fn_name:
            run = await sandbox.run(
                code, mode="call", fn_name=tests.fn_name, args=call_args[index], skip=skip
            )
        else:
            run = await sandbox.run(code, stdin=tests.inputs[index], skip=skip)
        if run.status is RunStatus.SKIPPED:
            return RUNTIME_ERROR, run.message, run
        if not run.ok:
            failed.set()
            return _error_code(run.status), run.message, run
        ok, message = (compare_return_value if tests.fn_name else compare_stdout)(
            run.stdout, tests.outputs[index]
        )
        if not ok:
            failed.set()
            return WRONG_ANSWER, message, run
        return True, "", run

    outcomes = await asyncio.gather(*(one(i) for i in range(len(tests.inputs))))
    elapsed = time.monotonic() - started
    result: list[bool | int] = []
    runs = [run for _, _, run in outcomes if run.status is not RunStatus.SKIPPED]
    own_failure = any(
        code is not True and run.status not in INFRASTRUCTURE_STATUSES and run.status is not RunStatus.SKIPPED
        for code, _, run in outcomes
    )
    machine = next((run for _, _, run in outcomes if run.status in INFRASTRUCTURE_STATUSES), None)
    if machine is not None and not own_failure:
        reason = f"not graded: {machine.message}"
        return GradeReport(False, [], {"error_message": machine.message}, reason, elapsed, runs, machine)
    for index, (code_or_ok, message, run) in enumerate(outcomes):
        result.append(code_or_ok)
        if code_or_ok is True:
            continue
        metadata = {
            "output": _short(run.stdout),
            "inputs": _short(tests.inputs[index]),
            "expected": _short(tests.outputs[index]),
            "error_code": code_or_ok,
            "error_message": message,
        }
        reason = f"test {index + 1}/{len(tests.inputs)} failed: {message}"
        if not stop_on_first_failure:
            result.extend(code for code, _, _ in outcomes[index + 1 :])
        return GradeReport(False, result, metadata, reason, elapsed, runs)
    reason = f"all {len(result)} tests passed"
    return GradeReport(True, result, {"execution_time_s": round(elapsed, 4)}, reason, elapsed, runs)


def _error_code(status: RunStatus) -> int:
    if status is RunStatus.COMPILE_ERROR:
        return COMPILE_ERROR
    if status is RunStatus.TIMEOUT:
        return TIME_LIMIT
    return RUNTIME_ERROR


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def _short(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return text
    return (
        text[: _SHOWN_CHARS // 2]
        + f"...({len(text) - _SHOWN_CHARS} chars cut)..."
        + text[-_SHOWN_CHARS // 2 :]
    )
