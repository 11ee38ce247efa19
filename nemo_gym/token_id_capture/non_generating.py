"""A model-server route that never returns generated text (``token_id_capture_non_generating_requests``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class NonGeneratingRequest(BaseModel):
    """One exact route of a model server that never returns generated text (``GET /metadata``)."""

    model_config = ConfigDict(extra="forbid")

    method: str
    path: str

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.isascii() or not value.isalpha():
            raise ValueError("method must be an HTTP method such as GET or POST")
        return value.upper()

    @field_validator("path")
    @classmethod
    def _exact(cls, path: str) -> str:
        if not path.startswith("/") or any(c in path for c in "?#*{}"):
            raise ValueError("path must start with '/' and be exact (no query, fragment or wildcard)")
        return path
