"""mcqa: multiple-choice questions; reward 1.0 when the extracted option letter is the expected one.

The letter is read from the response's text (every assistant text part, joined, as NeMo Gym reads
``response.output_text``). A per-row ``template_metadata.output_regex`` (a pattern or a list of
patterns) is tried first; otherwise the grading mode applies: the server config's
``grading_mode`` when set, else the row's. The modes and their rules are NeMo Gym's:

- ``strict_single_letter_boxed``: the LAST ``\\boxed{}`` holds one capital letter (padding such
  as ``[C]`` or ``\\text{}`` allowed) or starts with a labelled one (``E: ...``, ``C) ...``).
- ``lenient_boxed``: strict, else exactly one option's text occurs inside the last box.
- ``lenient_answer_colon``: the FIRST ``Answer: X`` line holds one letter (any case) or exactly
  one option's text.
- ``lenient_answer_colon_md``: markdown-aware (``**Answer: C**``, ``__Answer__: A``); the last
  ``Answer:`` line with a usable letter wins; a list of several letters (``A/B``, ``A or B``)
  is no answer.

Letters from other scripts (Arabic, Bengali, full-width) count as A-D. A letter only counts if
it is one of the row's options (the regex path trusts its capture, as NeMo Gym does).
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any, Literal

from pydantic import ConfigDict, model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
)
from nemo_gym.response_items import all_output_text, content_text, input_items

RowGradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]
GradingMode = Literal[
    "strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"
]

# Option lines in a prompt ("A: ...", "B) ...", "(C) ..."), used when a row carries no `options`.
_PROMPT_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[:.)]\)?\s+\S", re.MULTILINE)
_LONE_LETTER = re.compile(r"(?<![A-Za-z])([A-Za-z])(?![A-Za-z])")
# A box holding just a capital letter with non-letters around it: "E", "[C]", "(B)".
_BOXED_LETTER_ONLY = re.compile(r"^[^A-Za-z]*([A-Z])[^A-Za-z]*$")
# A box starting with a labelled capital letter: "E: ...", "C) ...", "B. ...", "D - ...".
_BOXED_LETTER_LABEL = re.compile(r"^\s*([A-Z])\s*[:).\-]")
_TEXT_WRAPPER = re.compile(r"\\text\{\s*(.*?)\s*\}", re.DOTALL)
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_ANSWER_COLON_MD = re.compile(r"[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)", re.IGNORECASE | re.MULTILINE)
_LEADING_LETTER = re.compile(r"^([a-zA-Z])(?![a-zA-Z0-9])")
_LAST_CAPITAL = re.compile(r"\b[A-Z]\b(?!.*\b[A-Z]\b)", re.DOTALL)
# What may stand between two letters for them to read as a list of answers: "A/B", "A or B", "A B".
_LIST_SEPARATOR = re.compile(r"(?:\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+)", re.IGNORECASE)
# Option letters written in other scripts (MMMLU-style prompts), each read as its Latin letter.
_OTHER_SCRIPT_LETTERS = str.maketrans(
    {
        **dict.fromkeys("أঅＡ", " A"),
        **dict.fromkeys("بবＢ", " B"),
        **dict.fromkeys("جডＣ", " C"),
        **dict.fromkeys("دঢＤ", " D"),
    }
)


class MCQAConfig(BaseResourcesServerConfig):
    """``grading_mode``: when set, it applies to every row (the row's own mode is ignored)."""

    grading_mode: GradingMode | None = None


class MCQARunRequest(BaseRunRequest):
    """A multiple-choice row (NeMo Gym's field names).

    ``options``: ``[{"A": "text"}, {"B": "text"}, ...]``; ``expected_answer``: the gold letter;
    ``grading_mode``: how the letter is extracted; ``template_metadata.output_regex``: optional
    per-row pattern(s) whose capture is the letter; tried first.
    """

    expected_answer: str
    options: list[dict[str, str | None]] | None = None
    grading_mode: RowGradingMode = "strict_single_letter_boxed"
    template_metadata: dict[str, Any] | None = None
    uuid: str | int | None = None

    @model_validator(mode="after")
    def _check(self) -> MCQARunRequest:
        if not self.expected_answer.strip():
            raise ValueError("expected_answer must be a non-empty option letter")
        return self


class MCQAVerifyRequest(MCQARunRequest, BaseVerifyRequest):
    """The row plus the model's response."""


class MCQAVerifyResponse(BaseVerifyResponse):
    """``extracted_answer``: the letter read (None if none); ``extraction``: how it was read.

    ``output_regex_error``: why a row's ``output_regex`` could not be used (grading fell back to
    the grading mode), else None.
    """

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    expected_answer: str
    extracted_answer: str | None
    extraction: str | None
    output_regex_error: str | None = None


def allowed_letters(row: MCQARunRequest) -> set[str]:
    """The option letters of a row: its ``options`` keys (null options excluded).

    A row without ``options`` (NeMo Gym's recorded rollouts drop them) takes the option lines
    of its prompt instead.
    """
    if row.options is not None:
        return {
            key.upper()
            for entry in row.options
            for key, value in entry.items()
            if len(key) == 1 and key.isalpha() and value is not None
        }
    prompt = next(
        (
            content_text(item.get("content"))
            for item in reversed(input_items(row.responses_create_params))
            if item.get("role") == "user"
        ),
        "",
    )
    return set(_PROMPT_OPTION_LINE.findall(prompt))


def option_texts(row: MCQARunRequest, letters: set[str]) -> dict[str, str]:
    """Allowed letter → normalized option text."""
    return {
        key.upper(): normalize(value)
        for entry in row.options or []
        for key, value in entry.items()
        if value is not None and key.upper() in letters
    }


def normalize(text: str) -> str:
    """Lowercase with whitespace collapsed, for comparing option texts."""
    return " ".join(str(text).lower().split())


def latin_letters(text: str) -> str:
    """``text`` with option letters of other scripts replaced by Latin ones, stripped."""
    return text.translate(_OTHER_SCRIPT_LETTERS).strip()


def last_boxed(text: str) -> str | None:
    r"""Everything inside the LAST ``\boxed{`` (braces balanced); None if none or unterminated."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 1
    for index in range(start + len("\\boxed{"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : index]
    return None


def boxed_contents(text: str) -> list[str]:
    r"""The contents of every complete ``\boxed{...}`` in ``text``, in order."""
    found = []
    start = text.find("\\boxed{")
    while start >= 0:
        index, depth = start + len("\\boxed{"), 1
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth:
            break
        found.append(text[start + len("\\boxed{") : index - 1])
        start = text.find("\\boxed{", index)
    return found


def strip_text_wrappers(value: str) -> str:
    r"""``\text{E}`` → ``E``, repeatedly."""
    while (m := _TEXT_WRAPPER.fullmatch(value)) is not None:
        value = m.group(1)
    return value


def from_strict_boxed(text: str, letters: set[str]) -> str | None:
    r"""The capital letter alone in, or labelling, the LAST ``\boxed{}``."""
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = strip_text_wrappers(inner.strip())
    m = _BOXED_LETTER_ONLY.match(inner) or _BOXED_LETTER_LABEL.match(inner)
    return m.group(1) if m and m.group(1) in letters else None


def from_boxed_option_text(text: str, options: dict[str, str]) -> str | None:
    r"""The one option whose text occurs inside the last ``\boxed{}`` (None if none or several)."""
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = inner.strip()
    candidates = {normalize(inner), normalize(strip_text_wrappers(inner))}
    matched = {key for key, value in options.items() if value and any(value in c for c in candidates)}
    return matched.pop() if len(matched) == 1 else None


def from_answer_colon(text: str, letters: set[str], options: dict[str, str]) -> str | None:
    """The FIRST ``Answer: X``: one letter (any case), else exactly one option's text."""
    m = _ANSWER_COLON.search(text)
    if m is None:
        return None
    candidate = strip_text_wrappers(m.group(1)).strip()
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in letters:
        return candidate.upper()
    return next((key for key, value in options.items() if value == normalize(candidate)), None)


def is_letter_list(text: str, letters: set[str]) -> bool:
    """Whether two different option letters stand next to each other as a list (``A/B``, ``A or B``)."""
    found = [
        (m.group(1).upper(), m.span(1)) for m in _LONE_LETTER.finditer(text) if m.group(1).upper() in letters
    ]
    return any(
        left != right and _LIST_SEPARATOR.fullmatch(text[left_span[1] : right_span[0]]) is not None
        for (left, left_span), (right, right_span) in pairwise(found)
    )


def choice_letter(payload: str, letters: set[str]) -> str | None:
    """The one option letter an ``Answer:`` payload gives: leading, else the last capital standing alone."""
    candidate = latin_letters(payload).strip("*_` \t\n\r.,;:")
    if is_letter_list(candidate, letters):
        return None
    if len(candidate) == 1:
        letter: str | None = candidate
    elif (m := _LEADING_LETTER.match(candidate)) is not None:
        letter = m.group(1)
    else:
        last = _LAST_CAPITAL.search(candidate)
        letter = last.group(0) if last else None
    return letter.upper() if letter and letter.upper() in letters else None


def from_answer_colon_md(text: str, letters: set[str]) -> str | None:
    """The last markdown-tolerant ``Answer:`` payload that yields a letter."""
    for payload in reversed(_ANSWER_COLON_MD.findall(text)):
        if (letter := choice_letter(payload, letters)) is not None:
            return letter
    return None


def from_regex(text: str, pattern: str, letters: set[str], options: dict[str, str]) -> str | None:
    """The letter (or option text) captured by the LAST match of ``pattern`` (case-insensitive).

    A captured single letter is trusted even if it is not among the options, as NeMo Gym does.
    """
    matches = list(re.finditer(pattern, text, re.IGNORECASE))
    if not matches:
        return None
    last = matches[-1]
    captured = next((g for g in last.groups() if g), None) if last.groups() else last.group(0)
    value = latin_letters((captured or "").strip()).upper()
    if len(value) == 1 and value.isalpha():
        return value
    return next((key for key, option in options.items() if option == normalize(value)), None)


def regex_patterns(row: MCQARunRequest) -> list[str]:
    """The row's ``template_metadata.output_regex`` as a list of patterns (empty if none)."""
    value = (row.template_metadata or {}).get("output_regex")
    if not value:
        return []
    return [str(p) for p in value] if isinstance(value, list) else [str(value)]


def extract_answer(row: MCQARunRequest, text: str, mode: str) -> tuple[str | None, str | None, str | None]:
    """``(letter, how, regex_error)``: the per-row regexes first, then grading ``mode``."""
    letters = allowed_letters(row)
    options = option_texts(row, letters)
    errors = []
    for pattern in regex_patterns(row):
        try:
            letter = from_regex(text, pattern, letters, options)
        except re.error as exc:
            errors.append(f"template_metadata.output_regex {pattern!r} is not a valid regex: {exc}")
            continue
        if letter is not None:
            return letter, "output_regex", None
    error = "; ".join(errors) or None
    if mode == "strict_single_letter_boxed":
        letter, how = from_strict_boxed(text, letters), "boxed"
    elif mode == "lenient_boxed":
        letter, how = from_strict_boxed(text, letters) or from_boxed_option_text(text, options), "boxed"
    elif mode == "lenient_answer_colon":
        letter, how = from_answer_colon(text, letters, options), "answer_colon"
    else:
        letter, how = from_answer_colon_md(text, letters), "answer_colon_md"
    return (letter, how if letter is not None else None, error)


class MCQAServer(SimpleResourcesServer):
    """Scores multiple-choice answers; ``extracted_answer`` feeds ``majority@k``."""

    config: MCQAConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts
    answer_field = "extracted_answer"

    async def verify(self, body: MCQAVerifyRequest) -> MCQAVerifyResponse:  # type: ignore[override]
        """1.0 if the letter extracted from the response text equals ``expected_answer``."""
        gold = body.expected_answer.strip().upper()
        if body.options and gold not in allowed_letters(body):
            raise HTTPError(422, f"expected_answer {gold!r} is not one of the row's options")
        text = all_output_text(body.response).strip()
        letter, how, regex_error = (
            extract_answer(body, text, self.config.grading_mode or body.grading_mode)
            if text
            else (None, None, None)
        )
        return MCQAVerifyResponse(
            **body.model_dump(exclude={"expected_answer"}),
            reward=float(letter == gold),
            expected_answer=gold,
            extracted_answer=letter,
            extraction=how,
            output_regex_error=regex_error,
        )


if __name__ == "__main__":
    MCQAServer.run_webserver()
