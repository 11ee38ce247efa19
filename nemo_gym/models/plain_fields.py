"""Responses API fields our own servers keep as plain dicts, and NeMo Gym's typed models elsewhere.

A request model's ``response`` / ``responses_create_params`` field is declared with
:class:`LazyTyped`: under plain bodies (:data:`~nemo_gym.serving.request_context.plain_bodies_in_effect`,
our own servers) it stays the parsed dict, shape-checked once per request; anywhere else it is
validated into NeMo Gym's typed model, imported on first use. :func:`merged` and
:func:`plain_fields` let such a model dump its plain dicts as they are instead of rebuilt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, GetJsonSchemaHandler, ValidationInfo
from pydantic_core import core_schema

from nemo_gym.response_items import ENVELOPE_DEFAULTS
from nemo_gym.serving.request_context import PlainBodies, plain_bodies_in_effect


class LazyTyped:
    """A field validated into a model of :mod:`nemo_gym.openai_utils`, imported on first use.

    ``openai_utils`` is built on the ``openai`` package (about 0.3 s and 30 MiB to import), so
    the request models below must not import it when they are defined: our own servers keep
    these fields as plain dicts (see :data:`~nemo_gym.serving.request_context.plain_bodies_in_effect`) and
    never need it. A NeMo Gym-style route, or a test building a request directly, validates the
    field into the typed model (an ``openai`` type, field errors located as usual) the first
    time it sees one.
    """

    def __init__(
        self,
        type_name: str,
        shape_errors: Callable[[Any], list[str]],
        walks: str,
        resolve: Callable[[str], type[BaseModel]],
    ) -> None:
        self.type_name = type_name
        self.resolve = resolve  # the typed model by name (imports ``openai`` when first called)
        self.shape_errors = shape_errors
        self.walks = walks  # the list a shape check walks (its cost): unchanged, a re-check is skipped
        self._typed: type[BaseModel] | None = None

    def typed(self) -> type[BaseModel]:
        """The typed model (importing ``openai`` the first time)."""
        if self._typed is None:
            self._typed = self.resolve(self.type_name)
        return self._typed

    def validate(self, value: Any, info: ValidationInfo) -> Any:
        plain = plain_bodies_in_effect.get()
        if plain and not isinstance(value, BaseModel):
            # Our own servers read these fields as dicts: check the shape a handler relies on
            # (a 422 naming the field) without building the typed model on the hot path. The
            # same dict checked earlier in this request (an answer built from the request's
            # ``model_dump()``, which hands it back as is) is not walked again.
            record = plain if isinstance(plain, PlainBodies) and value.__class__ is dict else None
            if record is not None:
                walked = value.get(self.walks)
                if record.already_checked(self, value, walked):
                    return value
            errors = self.shape_errors(value)
            if errors:
                raise ValueError("; ".join(errors[:5]))
            if record is not None:
                record.record(self, value, walked)
            return value
        if (
            self.type_name == "NeMoGymResponse"
            and isinstance(value, dict)
            and ("output" in value or not value)
        ):
            # NeMo Gym's model requires the envelope (id, created_at, ...); a verify body carrying
            # only ``output`` (or an empty response) is still a response here: the rest is filled
            # in and left unset. Without ``output`` (``{"id": ...}``: a model server's broken
            # answer) it is validated as NeMo Gym validates it, and fails.
            missing = [key for key in ENVELOPE_DEFAULTS if key not in value]
            typed = self.typed().__pydantic_validator__.validate_python(
                {**value, **{key: ENVELOPE_DEFAULTS[key] for key in missing}}, context=info.context
            )
            typed.__pydantic_fields_set__.difference_update(missing)
            return typed
        return self.typed().__pydantic_validator__.validate_python(value, context=info.context)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            self.validate,
            serialization=core_schema.wrap_serializer_function_ser_schema(
                dump_plain, schema=core_schema.any_schema()
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> Any:
        return handler(self.typed().__pydantic_core_schema__)


def dump_plain(value: Any, handler: Any) -> Any:
    """A plain dict is dumped as it is; anything else by pydantic."""
    return value if isinstance(value, dict) else handler(value)


def merged(
    model: type[BaseModel], rest: dict[str, Any], plain: dict[str, Any], *, by_alias: bool
) -> dict[str, Any]:
    """A dump of ``model`` from the dump of its other fields (``rest``) and its ``plain`` dicts:
    the declared fields in their order, then the rest (extra and computed fields) as dumped."""
    dumped = {}
    for name, field in model.model_fields.items():
        key = (field.serialization_alias or name) if by_alias else name
        if name in plain:
            dumped[key] = plain[name]
        elif key in rest:
            dumped[key] = rest.pop(key)
    dumped.update(rest)
    return dumped


@functools.cache
def plain_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` declared as :class:`LazyTyped` (plain dicts under plain bodies) that
    pydantic dumps as they are: none when the model has serializers of its own."""
    decorators = model.__pydantic_decorators__
    if decorators.model_serializers or decorators.field_serializers:
        return ()
    return tuple(
        name
        for name, field in model.model_fields.items()
        if any(isinstance(meta, LazyTyped) for meta in field.metadata)
        and not field.exclude
        and getattr(field, "exclude_if", None) is None
    )
