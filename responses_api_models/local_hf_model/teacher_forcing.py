"""Scripted turns, teacher-forced: the CPU engine says given text with the model's real token IDs and logprobs.

A tiny random model never writes a well-formed tool call, so an agent CLI driven by it ends at
its first answer. With ``teacher_forced_scripts`` the engine emits the script's turn instead of
sampling: the turn (text, and/or one tool call, and/or reasoning) is written as an assistant
message, rendered by the model's own chat template after the conversation, and the tokens the
template adds for it (up to and including the turn-end token) are the generation. So the IDs
are exactly those of that text under the template (a tool call in the template's own format,
which the engine's tool-call parser reads back as a call of the dialect the client speaks), and
``prompt + generation`` is the template's render of the conversation with the turn appended. The
logprobs are the model's own for those tokens, from one forward pass over prompt + generation
(teacher forcing): what a trainer's forward pass computes.

Which script and turn: the first script whose ``match`` regex is found in the conversation's
first user message (``null`` matches any), so concurrent rollouts of different tasks each follow
their own script with no state on the server; the turn is the number of assistant messages in
the conversation (call k of a rollout plays turn k; past the end the last turn repeats). A call
that no script matches is sampled as usual (an agent CLI's side calls: titles, summaries).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.base_responses_api_model import render_chat_token_ids


class ScriptedToolCall(BaseModel):
    """A tool call of a scripted turn: the tool's name and its arguments (a JSON object)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedTurn(BaseModel):
    """One model call's answer: ``text``, ``tool_call`` and ``reasoning`` (each optional, one at least)."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    tool_call: ScriptedToolCall | None = None
    reasoning: str | None = None

    def assistant_message(self) -> dict[str, Any]:
        """The turn as a Chat Completions assistant message, as a chat template reads one."""
        if self.text is None and self.tool_call is None and self.reasoning is None:
            raise ValueError("a scripted turn needs text, tool_call or reasoning")
        message: dict[str, Any] = {"role": "assistant", "content": self.text or ""}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_call is not None:
            function = {"name": self.tool_call.name, "arguments": self.tool_call.arguments}
            message["tool_calls"] = [{"id": "call_scripted", "type": "function", "function": function}]
        return message


class TeacherScript(BaseModel):
    """A regex searched in the first user message (``None``: any conversation) and its turns."""

    model_config = ConfigDict(extra="forbid")

    match: str | None = None
    turns: list[ScriptedTurn] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"match {value!r} is not a valid regex: {exc}") from exc
        return value

    @field_validator("turns")
    @classmethod
    def _turns_say_something(cls, value: list[ScriptedTurn]) -> list[ScriptedTurn]:
        for index, turn in enumerate(value):
            if turn.text is None and turn.tool_call is None and turn.reasoning is None:
                raise ValueError(f"turns[{index}] needs text, tool_call or reasoning")
        return value


def load_scripts(path: str | Path) -> list[TeacherScript]:
    """Scripts from a file: a YAML or JSON list, or JSON Lines (one script a line).

    Raises ``ValueError`` naming the file and the line or index of a script that does not validate.
    """
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise ValueError(f"teacher_forced_script_file {str(source)!r} cannot be read: {exc}") from exc
    if source.suffix == ".jsonl":
        entries = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    entries.append((f"line {number}", orjson.loads(line)))
                except orjson.JSONDecodeError as exc:
                    raise ValueError(f"{source}:{number}: not JSON: {exc}") from exc
    else:
        loaded = yaml.safe_load(text)
        if not isinstance(loaded, list):
            raise ValueError(f"{source}: expected a list of scripts ({{match, turns}})")
        entries = [(f"script {index}", entry) for index, entry in enumerate(loaded)]
    scripts = []
    for where, entry in entries:
        try:
            scripts.append(TeacherScript.model_validate(entry))
        except ValueError as exc:
            raise ValueError(f"{source}: {where}: {exc}") from exc
    return scripts


class ScriptBook:
    """The scripts of one engine, and the forced token IDs of the turn a conversation is at."""

    def __init__(self, scripts: list[TeacherScript]) -> None:
        self.scripts = scripts
        self._patterns = [re.compile(s.match) if s.match is not None else None for s in scripts]

    def turn_for(self, messages: list[dict[str, Any]]) -> ScriptedTurn | None:
        """The scripted turn for the next call of this conversation (None: no script matches)."""
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        text = _text(first_user.get("content")) if first_user is not None else ""
        for script, pattern in zip(self.scripts, self._patterns, strict=True):
            if pattern is None or pattern.search(text):
                index = sum(1 for m in messages if m.get("role") == "assistant")
                return script.turns[min(index, len(script.turns) - 1)]
        return None

    def forced_ids(
        self,
        turn: ScriptedTurn,
        messages: list[dict[str, Any]],
        tokenizer: Any,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
        turn_end_ids: list[int],
    ) -> list[int]:
        """The token IDs the chat template writes for ``turn`` after ``messages``, through its turn end.

        Raises ``ValueError`` when the template's render of the conversation with the turn does
        not begin with its render of the conversation alone (it rewrites earlier turns when a
        new one follows), where no IDs could be the turn's alone.
        """
        prompt = render_chat_token_ids(
            messages, tokenizer, tools, template_kwargs, add_generation_prompt=True
        )
        full = render_chat_token_ids(
            [*messages, turn.assistant_message()],
            tokenizer,
            tools,
            template_kwargs,
            add_generation_prompt=False,
        )
        if full[: len(prompt)] != prompt:
            raise ValueError(
                "the chat template renders the conversation differently once the scripted turn follows; "
                "its tokens cannot be told apart from the prompt's"
            )
        suffix = full[len(prompt) :]
        ends = set(turn_end_ids)
        cut = next((index for index, token in enumerate(suffix) if token in ends), None)
        if cut is None:
            return suffix + turn_end_ids[:1]
        return suffix[: cut + 1]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""
