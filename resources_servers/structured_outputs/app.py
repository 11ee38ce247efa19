"""structured_outputs: reward 1.0 when the model's output parses and validates against the row's JSON Schema.

Two answer surfaces, as in NeMo Gym: ``text`` (the response's assistant text, all parts joined,
is a JSON, YAML, XML, TOML or CSV document, by ``schema_type``) and ``tool_call`` (the answer is
the arguments of exactly one function call, to ``tool_name`` when the row names one, unwrapped
from ``tool_payload_key`` when set; a second call, e.g. to a distractor tool, scores 0). A
failure scores 0.0 with NeMo Gym's ``error_type``. Parsed documents are walked with a node and depth budget before
validation, so deeply nested or alias-exploding answers cost bounded time.
"""

from __future__ import annotations

import asyncio
import copy
import csv
import datetime
import io
import json
import tomllib
import xml.etree.ElementTree as ElementTree
from functools import lru_cache
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.base_resources_server import (
    SESSION_COOKIE,
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    json_nesting_depth,
    json_response,
)
from nemo_gym.response_items import all_output_text, function_calls

SchemaType = Literal["json", "yaml", "xml", "toml", "csv"]
# NeMo Gym's names, plus too_large / too_deep for answers past this server's work budget.
ErrorType = Literal[
    "empty_response",
    "parse_error",
    "validation_error",
    "api_error",
    "missing_tool_call",
    "multiple_tool_calls",
    "wrong_tool_name",
    "tool_arguments_parse_error",
    "missing_tool_payload_key",
    "too_large",
    "too_deep",
]
TOOL_ACK = "Received. Your structured answer will be checked; no further action is needed."


class StructuredOutputsConfig(BaseResourcesServerConfig):
    """Verification settings.

    ``strict_schema``: every object schema with ``properties`` requires all of them and allows no
    others (NeMo Gym's rule, and OpenAI strict mode's). ``check_formats``: enforce ``format``
    (email, date, uri, ...). ``max_output_chars`` / ``max_nodes`` / ``max_depth`` bound the work
    one answer can cause.
    """

    strict_schema: bool = True
    check_formats: bool = False
    xml_coerce_types: bool = True
    max_output_chars: int = Field(default=4_000_000, ge=1)
    max_nodes: int = Field(default=1_000_000, ge=1)
    max_depth: int = Field(default=100, ge=1)


class StructuredOutputsRunRequest(BaseRunRequest):
    """A row (NeMo Gym's field names): ``schema_str`` (a JSON Schema as a JSON string),
    ``schema_type`` (the answer's format), and for ``response_mode: tool_call`` the ``tool_name``
    to call (optional: any one call counts when absent) and an optional ``tool_payload_key``
    wrapping the payload in the arguments."""

    schema_str: str
    schema_type: SchemaType = "json"
    response_mode: Literal["text", "tool_call"] | None = None
    tool_name: str | None = None
    tool_payload_key: str | None = None

    @field_validator("schema_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("schema_str")
    @classmethod
    def _valid_schema(cls, value: str) -> str:
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"schema_str is not valid JSON: {exc}") from exc
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"schema_str is not a valid JSON Schema: {exc.message}") from exc
        return value


class StructuredOutputsVerifyRequest(StructuredOutputsRunRequest, BaseVerifyRequest):
    """The row plus the model's response."""


class StructuredOutputsVerifyResponse(BaseVerifyResponse):
    """``error_type`` (None when valid) and a short ``error_message``."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    error_type: ErrorType | None = None
    error_message: str | None = None


class AnswerError(Exception):
    """An answer that fails verification: its ``error_type`` and message."""

    def __init__(self, error_type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.error_type: ErrorType = error_type
        self.message = message


# ---- schema ------------------------------------------------------------------------------------
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def strictify(schema: Any) -> Any:
    """A copy where every object schema with ``properties`` requires them all and forbids others.

    Walks subschemas by keyword, so a property that happens to be *named* ``properties`` is left alone.
    """

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if isinstance(node.get("properties"), dict):
            node["required"] = list(node["properties"])
            node["additionalProperties"] = False
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for child in node[key].values():
                    walk(child)
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for child in node[key]:
                    walk(child)
        for key in _SUBSCHEMAS:
            walk(node.get(key))

    copied = copy.deepcopy(schema)
    walk(copied)
    return copied


@lru_cache(maxsize=512)
def compiled_validator(schema_str: str, strict: bool, check_formats: bool) -> jsonschema.protocols.Validator:
    """A validator for a schema string (cached: rollouts of one task share the schema)."""
    schema = json.loads(schema_str)
    if strict:
        schema = strictify(schema)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER if check_formats else None)


def schema_for(schema_str: str) -> Any:
    """The schema as parsed JSON (for type coercion of XML and CSV)."""
    return json.loads(schema_str)


# ---- parsing -----------------------------------------------------------------------------------
class _StringDatesLoader(yaml.SafeLoader):
    """Safe YAML without implicit timestamps: ``2024-05-01`` stays a string, as in JSON."""


_StringDatesLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def parse_document(text: str, schema_type: SchemaType) -> Any:
    """Parse ``text`` as ``schema_type``; raises on malformed input."""
    if schema_type == "json":
        return json.loads(text)
    if schema_type == "yaml":
        return yaml.load(text, Loader=_StringDatesLoader)  # noqa: S506 - a SafeLoader subclass
    if schema_type == "toml":
        return tomllib.loads(text)
    if schema_type == "xml":
        root = ElementTree.fromstring(text)
        return {root.tag: _xml_value(root)}
    return list(csv.DictReader(io.StringIO(text.strip())))


def _xml_value(element: ElementTree.Element) -> Any:
    """xmltodict's mapping: attributes as ``@name``, repeated children as lists, text as ``#text``."""
    children = list(element)
    text = (element.text or "").strip()
    if not children and not element.attrib:
        return text or None
    value: dict[str, Any] = {f"@{k}": v for k, v in element.attrib.items()}
    for child in children:
        item = _xml_value(child)
        if child.tag in value:
            existing = value[child.tag]
            value[child.tag] = (existing if isinstance(existing, list) else [existing]) + [item]
        else:
            value[child.tag] = item
    if text:
        value["#text"] = text
    return value


def coerce_types(data: Any, schema: Any) -> Any:
    """Turn the strings XML and CSV produce into the numbers/booleans the schema asks for."""
    if not isinstance(schema, dict):
        return data
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" in kinds and isinstance(data, dict):
        properties = schema.get("properties") or {}
        return {k: coerce_types(v, properties.get(k)) for k, v in data.items()}
    if "array" in kinds:
        if isinstance(data, dict) and len(data) == 1:  # <items><item>..</item></items>
            data = next(iter(data.values()))
        if data is None:
            data = []
        if not isinstance(data, list):
            data = [data]
        return [coerce_types(item, schema.get("items")) for item in data]
    if data is None and "string" in kinds:
        return ""
    if isinstance(data, str):
        if data == "" and "null" in kinds:
            return None
        for target in kinds:
            try:
                if target == "integer":
                    return int(data)
                if target == "number":
                    return float(data)
            except ValueError:
                continue
            if target == "boolean" and data.lower() in ("true", "false", "1", "0"):
                return data.lower() in ("true", "1")
    return data


def to_json_like(value: Any, max_nodes: int, max_depth: int) -> Any:
    """A plain-JSON copy of a parsed document within a node and depth budget.

    Dates and times become ISO strings, keys become strings, tuples lists. YAML aliases are
    expanded here, so a document that would explode (a "billion laughs") runs out of budget
    instead of time.
    """
    budget = [max_nodes]

    def walk(node: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise AnswerError("too_large", f"the answer has more than {max_nodes} values")
        if depth > max_depth:
            raise AnswerError("too_deep", f"the answer nests deeper than {max_depth} levels")
        if isinstance(node, dict):
            return {str(k): walk(v, depth + 1) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v, depth + 1) for v in node]
        if isinstance(node, datetime.date | datetime.time):
            return node.isoformat()
        return node

    return walk(value, 0)


# ---- the server --------------------------------------------------------------------------------
class _Parsed:
    """An already-parsed answer (tool arguments), as opposed to text still to parse."""

    def __init__(self, value: Any) -> None:
        self.value = value


class StructuredOutputsServer(SimpleResourcesServer):
    """Checks structured answers (text documents or tool-call arguments) against a JSON Schema."""

    config: StructuredOutputsConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    def routes(self) -> list[Route]:
        """The standard routes plus an acknowledgement for the row's own answer tools.

        With ``response_mode: tool_call`` the tool call *is* the answer; an agent that executes
        calls gets a short acknowledgement for the tools offered to this rollout (404 otherwise).
        """
        return super().routes() + [Route("/{tool_name}", self._acknowledge_answer_tool, methods=["POST"])]

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Remember the tool names offered to this rollout (they are acknowledged, not executed)."""
        tools = body.responses_create_params.get("tools") or []
        self.session["answer_tools"] = [t.get("name") for t in tools if isinstance(t, dict)]
        return BaseSeedSessionResponse()

    async def _acknowledge_answer_tool(self, request: Request) -> Response:
        name = request.path_params["tool_name"]
        session_id = request.cookies.get(SESSION_COOKIE)
        state = self.sessions.get(session_id, create=False) if session_id else None
        if not state or name not in state.get("answer_tools", []):
            return json_response(
                {"error": f"no route or answer tool named {name!r}", "server": self.name}, 404
            )
        return json_response({"status": "received", "message": TOOL_ACK})

    async def verify(self, body: StructuredOutputsVerifyRequest) -> StructuredOutputsVerifyResponse:  # type: ignore[override]
        """1.0 if the answer parses and validates against ``schema_str``; else 0.0 with ``error_type``."""
        try:
            # Parsing and validating can take a while on big answers: keep the event loop free.
            await asyncio.to_thread(lambda: self.check_document(body, self.answer_document(body)))
        except AnswerError as exc:
            return StructuredOutputsVerifyResponse(
                **body.model_dump(), reward=0.0, error_type=exc.error_type, error_message=exc.message[:500]
            )
        return StructuredOutputsVerifyResponse(**body.model_dump(), reward=1.0)

    def answer_document(self, body: StructuredOutputsVerifyRequest) -> str | _Parsed:
        """The answer to check: the last assistant message's text, or the (unwrapped) tool arguments."""
        output = body.response.get("output") or []
        if body.response_mode != "tool_call":
            text = all_output_text(body.response)
            if not text.strip():
                raise AnswerError("empty_response", "no assistant text in the response")
            if len(text) > self.config.max_output_chars:
                raise AnswerError(
                    "too_large",
                    f"the answer has {len(text)} characters (limit {self.config.max_output_chars})",
                )
            return text
        if body.response.get("error"):
            raise AnswerError("api_error", str(body.response["error"])[:200])
        calls = function_calls(output)
        called = ", ".join(str(c.get("name")) for c in calls)
        if not calls:
            raise AnswerError("missing_tool_call", "no function_call item in the response")
        if len(calls) > 1:
            raise AnswerError("multiple_tool_calls", f"expected exactly one function call, got: {called}")
        if body.tool_name and calls[0].get("name") != body.tool_name:
            raise AnswerError("wrong_tool_name", f"expected a call to {body.tool_name!r}, got: {called}")
        arguments = calls[0].get("arguments")
        if isinstance(arguments, str):
            if len(arguments) > self.config.max_output_chars:
                raise AnswerError("too_large", f"the arguments have {len(arguments)} characters")
            self.check_depth(arguments)
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise AnswerError(
                    "tool_arguments_parse_error", f"the arguments are not valid JSON: {str(exc)[:200]}"
                ) from exc
        elif not isinstance(arguments, dict):
            raise AnswerError(
                "tool_arguments_parse_error",
                f"arguments of type {type(arguments).__name__}, not a JSON string",
            )
        if body.tool_payload_key:
            if not isinstance(arguments, dict) or body.tool_payload_key not in arguments:
                raise AnswerError(
                    "missing_tool_payload_key", f"the arguments have no {body.tool_payload_key!r} key"
                )
            arguments = arguments[body.tool_payload_key]
        return _Parsed(arguments)

    def check_depth(self, text: str) -> None:
        """Refuse JSON text nested past ``max_depth`` before parsing it: a parser recursing to
        the interpreter's limit leaves no stack for anything else running then (finalizers)."""
        depth = json_nesting_depth(text.encode())
        if depth > self.config.max_depth:
            raise AnswerError(
                "too_deep", f"the answer nests {depth} levels deep, over {self.config.max_depth}"
            )

    def check_document(self, body: StructuredOutputsVerifyRequest, document: str | _Parsed) -> None:
        """Parse (text answers), coerce (XML, CSV), bound, and validate; raises :class:`AnswerError`."""
        if isinstance(document, _Parsed):
            value = document.value
        else:
            if body.schema_type == "json":
                self.check_depth(document)
            try:
                value = parse_document(document, body.schema_type)
            except RecursionError as exc:
                raise AnswerError("too_deep", "the answer nests too deeply to parse") from exc
            except Exception as exc:  # noqa: BLE001 - every parser has its own error types
                raise AnswerError(
                    "parse_error", f"not valid {body.schema_type}: {type(exc).__name__}: {str(exc)[:200]}"
                ) from exc
            if body.schema_type == "csv" or (body.schema_type == "xml" and self.config.xml_coerce_types):
                value = coerce_types(value, schema_for(body.schema_str))
        value = to_json_like(value, self.config.max_nodes, self.config.max_depth)
        validator = compiled_validator(body.schema_str, self.config.strict_schema, self.config.check_formats)
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        except RecursionError as exc:
            raise AnswerError("too_deep", "the answer nests too deeply to validate") from exc
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise AnswerError("validation_error", f"at {where}: {error.message[:300]}")


if __name__ == "__main__":
    StructuredOutputsServer.run_webserver()
