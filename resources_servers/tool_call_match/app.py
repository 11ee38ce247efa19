"""tool_call_match: single-step function calling, scored by comparing calls (tools are never run).

The row offers tools in ``responses_create_params.tools`` and lists the calls a correct answer
makes in ``expected_calls`` (``[{name, arguments}]``). ``verify`` pairs the response's
``function_call`` items with the expected calls: a pair matches when the names are equal and the
arguments are equal as typed JSON (object keys in any order; ``"14"`` is not ``14``, ``true`` is
not ``1``). Reward 1.0 when every expected call is matched and no other call was made.

Tool routes: ``POST /<any offered tool>`` checks the arguments against the tool's ``parameters``
schema (422 naming the field when they do not fit) and answers without running anything, so an
agent loop can go on; ``seed_session`` remembers which tools the row offers.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from jsonschema import SchemaError, validators
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
)
from nemo_gym.response_items import function_calls

_TOOL_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("tool_call_match_tool_name", default="")
_REQUIRED = re.compile(r"^'(.+)' is a required property$")


class ToolCallMatchConfig(BaseResourcesServerConfig):
    """How strictly calls are compared.

    - ``allow_extra_arguments``: a predicted call may pass arguments the expected call does not
      list (e.g. optional parameters spelled out); the listed ones must still match.
    - ``require_schema_valid``: the reward also needs every call to fit its tool's schema.
    """

    allow_extra_arguments: bool = False
    require_schema_valid: bool = False


class ExpectedCall(BaseModel):
    """One expected call: a tool name and its arguments (an object, or a JSON string of one)."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


_EXPECTED_CALLS = TypeAdapter(list[ExpectedCall])


class ToolCallMatchVerifyResponse(BaseVerifyResponse):
    """Reward, ``reward_components`` and what was compared."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    reward_components: dict[str, float] | None = None
    num_expected: int
    num_predicted: int
    num_correct: int
    predicted_calls: list[dict[str, Any]]
    mismatches: list[str]
    schema_errors: list[str]


@dataclass
class CallMatch:
    """The comparison of predicted calls with expected calls (see :func:`match_calls`)."""

    num_expected: int
    num_predicted: int
    num_correct: int
    name_correct: bool
    arguments_correct: bool
    schema_valid: bool
    predicted_calls: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    schema_errors: list[str] = field(default_factory=list)


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


def json_equal(a: Any, b: Any) -> bool:
    """Equality of parsed JSON values by JSON type: ``1 == 1.0`` but ``1 != true`` and ``1 != "1"``."""
    kind_a, kind_b = json_type(a), json_type(b)
    numbers = {"integer", "number"}
    if kind_a in numbers and kind_b in numbers:
        return bool(a == b)
    if kind_a != kind_b:
        return False
    if kind_a == "object":
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if kind_a == "array":
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """A call's arguments as an object (``arguments`` is a JSON string on the wire); None if not one."""
    if isinstance(raw, dict):
        return raw
    try:
        value = orjson.loads(raw) if isinstance(raw, str | bytes) else None
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def argument_differences(
    expected: dict[str, Any], predicted: dict[str, Any] | None, allow_extra: bool
) -> list[str]:
    """Why ``predicted`` arguments do not match ``expected`` ones ([] when they match)."""
    if predicted is None:
        return ["arguments are not a JSON object"]
    found = []
    for key, want in expected.items():
        if key not in predicted:
            found.append(f"argument {key!r} missing (expected {_show(want)})")
        elif not json_equal(want, predicted[key]):
            found.append(f"argument {key!r}: expected {_show(want)}, got {_show(predicted[key])}")
    extra = sorted(set(predicted) - set(expected))
    if extra and not allow_extra:
        found.append(f"unexpected argument(s) {extra}")
    return found


def schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """Where ``arguments`` break a JSON schema, each as ``field: message`` (a required field is named)."""
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
    except SchemaError as exc:
        return [f"(schema): the tool's parameters schema is invalid: {exc.message}"]
    problems = []
    for error in sorted(validator_class(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        path = [str(p) for p in error.absolute_path]
        missing = _REQUIRED.match(error.message) if error.validator == "required" else None
        if missing:
            path.append(missing.group(1))
        problems.append(f"{'.'.join(path) or '(arguments)'}: {error.message}")
    return problems


def offered_tools(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The function tools a request offers, by name → ``parameters`` schema."""
    tools = {}
    for entry in params.get("tools") or []:
        if not isinstance(entry, dict) or entry.get("type", "function") != "function":
            continue
        spec: dict[str, Any] = entry["function"] if isinstance(entry.get("function"), dict) else entry
        if spec.get("name"):
            tools[str(spec["name"])] = spec.get("parameters") or {"type": "object"}
    return tools


def match_calls(
    predicted: list[dict[str, Any]],
    expected: list[ExpectedCall],
    tools: dict[str, dict[str, Any]],
    allow_extra: bool = False,
) -> CallMatch:
    """Pair predicted calls (``{name, arguments}``) with expected calls, one to one, as many as possible.

    A pair needs equal names and matching arguments (:func:`argument_differences`). The pairing
    is a maximum bipartite matching, so the order of calls never matters.
    """
    want = [(e.name, parse_arguments(e.arguments) or {}) for e in expected]
    got = [(str(p.get("name") or ""), parse_arguments(p.get("arguments"))) for p in predicted]
    fits = [
        [
            j
            for j, (name, args) in enumerate(got)
            if name == e_name and not argument_differences(e_args, args, allow_extra)
        ]
        for e_name, e_args in want
    ]
    owner: dict[int, int] = {}  # predicted index → expected index

    def augment(i: int, seen: set[int]) -> bool:
        for j in fits[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(want)):
        augment(i, set())
    paired = {i: j for j, i in owner.items()}

    # Explain each unmatched expected call by the first unmatched call of the same name, if any.
    mismatches = []
    explained: set[int] = set()
    for i, (name, args) in enumerate(want):
        if i in paired:
            continue
        j = next(
            (j for j, (n, _) in enumerate(got) if n == name and j not in owner and j not in explained), None
        )
        if j is None:
            mismatches.append(f"{name}: expected call not made")
        else:
            explained.add(j)
            mismatches.append(f"{name}: " + "; ".join(argument_differences(args, got[j][1], allow_extra)))
    mismatches += [
        f"{got[j][0]}: unexpected call" for j in range(len(got)) if j not in owner and j not in explained
    ]

    errors = []
    for j, (name, sent) in enumerate(got):
        if name not in tools:
            errors.append(f"call {j} {name!r}: no such tool is offered")
        elif sent is None:
            errors.append(f"call {j} {name!r}: arguments are not a JSON object")
        else:
            errors += [f"call {j} {name!r}: {p}" for p in schema_problems(tools[name], sent)]
    return CallMatch(
        num_expected=len(want),
        num_predicted=len(got),
        num_correct=len(owner),
        name_correct=Counter(n for n, _ in want) == Counter(n for n, _ in got),
        arguments_correct=len(owner) == len(want) == len(got),
        schema_valid=not errors,
        # Unparseable arguments are shown as sent, so the diagnostics say what the model wrote.
        predicted_calls=[
            {"name": n, "arguments": a if a is not None else p.get("arguments")}
            for (n, a), p in zip(got, predicted, strict=True)
        ],
        mismatches=mismatches,
        schema_errors=errors,
    )


class ToolCallMatchServer(SimpleResourcesServer):
    """Scores function calls against the row's expected calls; tool routes validate but never execute.

    ``expected_calls_field`` names the row field holding the expected calls.
    """

    config: ToolCallMatchConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts
    expected_calls_field: ClassVar[str] = "expected_calls"

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Remember the row's tools, so tool routes can check arguments against their schemas."""
        self.session["tools"] = offered_tools(body.responses_create_params)
        return BaseSeedSessionResponse()

    async def verify(self, body: BaseVerifyRequest) -> ToolCallMatchVerifyResponse:
        """Compare the response's function calls with the expected ones (see :func:`match_calls`)."""
        expected = self.expected_calls(body)
        predicted = [
            {"name": c.get("name"), "arguments": c.get("arguments")}
            for c in function_calls(body.response.get("output") or [])
        ]
        tools = offered_tools(body.responses_create_params)
        # Schema validation is CPU work that grows with the tools' size: keep it off the event loop.
        result = await asyncio.to_thread(
            match_calls, predicted, expected, tools, self.config.allow_extra_arguments
        )
        passed = result.arguments_correct and (result.schema_valid or not self.config.require_schema_valid)
        return ToolCallMatchVerifyResponse(
            **body.model_dump(),
            reward=float(passed),
            reward_components={
                "name_correct": float(result.name_correct),
                "arguments_correct": float(result.arguments_correct),
                "schema_valid": float(result.schema_valid),
            },
            num_expected=result.num_expected,
            num_predicted=result.num_predicted,
            num_correct=result.num_correct,
            predicted_calls=result.predicted_calls,
            mismatches=result.mismatches,
            schema_errors=result.schema_errors,
        )

    def expected_calls(self, body: BaseVerifyRequest) -> list[ExpectedCall]:
        """The row's expected calls, validated; a 422 naming the field when they are malformed."""
        name = self.expected_calls_field
        raw = (body.model_extra or {}).get(name)
        if raw is None:
            raise HTTPError(
                422,
                f"invalid body: {name}: field required (a list of {{name, arguments}}; [] when no call is expected)",
            )
        try:
            calls = _EXPECTED_CALLS.validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (name, *first["loc"]))
            raise HTTPError(422, f"invalid body: {where}: {first['msg']}") from exc
        for i, call in enumerate(calls):
            if parse_arguments(call.arguments) is None:
                raise HTTPError(422, f"invalid body: {name}.{i}.arguments: not a JSON object")
        return calls

    async def record_call(self, body: dict[str, Any]) -> dict[str, Any]:
        """A call to any offered tool: check its arguments against the schema, run nothing."""
        name = _TOOL_NAME.get()
        state = self.sessions.get(self.session_id or "", create=False)
        tools = (state or {}).get("tools")
        if tools is None:
            raise HTTPError(
                404,
                f"no tool named {name!r}: this rollout has no session (call /seed_session with the row first)",
            )
        if name not in tools:
            raise HTTPError(404, f"no tool named {name!r}; the row offers {sorted(tools)}")
        problems = (
            await asyncio.to_thread(schema_problems, tools[name], body)
            if isinstance(body, dict)
            else ["(arguments): not a JSON object"]
        )
        if problems:
            raise HTTPError(422, f"invalid arguments for tool {name!r}: " + "; ".join(problems))
        return {
            "status": "not_executed",
            "message": f"{name} was recorded; this environment scores calls without running them",
        }

    def routes(self) -> list[Route]:
        """The built-in routes, then ``POST /<tool name>`` for any tool the rollout's row offers."""
        record = self.endpoint(self.record_call)

        async def any_tool(request: Request) -> Response:
            token = _TOOL_NAME.set(request.path_params["tool_name"])
            try:
                return await record(request)
            finally:
                _TOOL_NAME.reset(token)

        # Last, so /seed_session, /verify and /aggregate_metrics keep their own handlers.
        return super().routes() + [Route("/{tool_name}", any_tool, methods=["POST"])]


def _show(value: Any) -> str:
    return f"{orjson.dumps(value).decode()} ({json_type(value)})"


if __name__ == "__main__":
    ToolCallMatchServer.run_webserver()
