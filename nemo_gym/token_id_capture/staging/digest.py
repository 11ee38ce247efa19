"""Integrity encodings of staged token deltas (NeMo Gym's staging wire contract, version 2).

A staged call's digest covers its metadata and token columns; masks and log-probabilities are
hashed as IEEE-754 float32 bit patterns; optional extras are hashed separately (a typed binary
encoding, not JSON) and their digest enters the call digest, so token data is verifiable without
loading extras. ``chain_hash`` links each delta to its parent's; ``cumulative_hash`` covers the
whole sequence. Every value is length-prefixed and versioned.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

STAGING_SCHEMA_VERSION = 2
STAGING_DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1

_CALL_DOMAIN = b"nemo-gym-staging-call-v2"
_EXTRAS_DOMAIN = b"nemo-gym-staging-extras-v1"
_TOKENS_DOMAIN = b"nemo-gym-staging-prefix-v2"
_CHAIN_DOMAIN = b"nemo-gym-staging-chain-v1"


def _u64(value: int, what: str) -> bytes:
    if type(value) is not int or not 0 <= value < 2**64:
        raise ValueError(f"{what} must be an unsigned 64-bit integer, got {value!r}")
    return struct.pack(">Q", value)


def _sized(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def _text(value: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return _sized(value.encode())


def _check_hex_digest(value: Any, what: str) -> None:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{what} must be a lowercase SHA-256 hex digest")


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Count, then each ID, as unsigned big-endian 64-bit integers."""
    return _u64(len(token_ids), "token count") + b"".join(_u64(t, "token_id") for t in token_ids)


def hash_token_ids(token_ids: Sequence[int]) -> str:
    """Hash of one exact cumulative token sequence."""
    return hashlib.sha256(_TOKENS_DOMAIN + encode_token_ids(token_ids)).hexdigest()


def compute_chain_hash(parent_chain_hash: str | None, token_ids_delta: Sequence[int]) -> str:
    """``H(parent chain hash || delta)``; a root chains from nothing (a distinct marker byte)."""
    if parent_chain_hash is None:
        head = b"\x00"
    else:
        _check_hex_digest(parent_chain_hash, "parent_chain_hash")
        head = b"\x01" + bytes.fromhex(parent_chain_hash)
    return hashlib.sha256(_CHAIN_DOMAIN + head + encode_token_ids(token_ids_delta)).hexdigest()


def _float32s(values: Sequence[float], what: str) -> bytes:
    out = bytearray(_u64(len(values), f"{what} length"))
    for value in values:
        if type(value) is not float or not math.isfinite(value):
            raise ValueError(f"{what} values must be finite floats, got {value!r}")
        try:
            packed = struct.pack(">f", value)
        except (OverflowError, struct.error) as exc:
            raise ValueError(f"{what} value {value!r} does not fit a float32") from exc
        if not math.isfinite(struct.unpack(">f", packed)[0]):
            raise ValueError(f"{what} value {value!r} overflows a float32")
        out += packed
    return bytes(out)


def _extra(value: Any) -> bytes:
    kind = type(value)
    if value is None:
        return b"N"
    if kind is bool:
        return b"B" + (b"\x01" if value else b"\x00")
    if kind is int:
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"extras integer {value} is outside the signed 64-bit range")
        return b"I" + struct.pack(">q", value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"extras floats must be finite, got {value!r}")
        return b"F" + struct.pack(">d", value)
    if kind is str:
        return b"S" + _text(value)
    if kind is list:
        return b"L" + _u64(len(value), "extras list length") + b"".join(_extra(v) for v in value)
    if kind is dict:
        if any(type(k) is not str for k in value):
            raise TypeError("extras mappings need string keys")
        keys = sorted(value, key=lambda k: k.encode())
        return (
            b"D"
            + _u64(len(keys), "extras mapping length")
            + b"".join(_text(k) + _extra(value[k]) for k in keys)
        )
    raise TypeError(f"extras cannot hold a {kind.__name__}")


def compute_extras_digest(extras: Mapping[str, Any] | None) -> str:
    """Digest of an extras mapping (None, exact scalars, lists, string-keyed dicts only)."""
    if extras is not None and not isinstance(extras, Mapping):
        raise TypeError(f"extras must be a mapping or None, got {type(extras).__name__}")
    normalized = None if extras is None else dict(extras)
    return hashlib.sha256(
        _EXTRAS_DOMAIN + struct.pack(">B", EXTRAS_DIGEST_VERSION) + _extra(normalized)
    ).hexdigest()


EMPTY_EXTRAS_DIGEST = compute_extras_digest(None)


def check_delta(
    *,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    token_ids_delta: Sequence[int],
    token_mask_delta: Sequence[float],
    generation_log_probs_delta: Sequence[float],
) -> None:
    """Raise ``ValueError`` unless the delta is well formed: roots are text-mode at 0, children
    token_in past 0, columns of equal non-zero length, masks 0/1 with 0.0 log-probs on carry."""
    if parent_call_id == "":
        raise ValueError("parent_call_id must be non-empty when present")
    if mode not in ("text", "token_in"):
        raise ValueError(f"capture mode {mode!r} is neither 'text' nor 'token_in'")
    if parent_call_id is None and (prev_len != 0 or mode != "text"):
        raise ValueError("a parentless call must be a text-mode root with prev_len == 0")
    if parent_call_id is not None and (prev_len == 0 or mode != "token_in"):
        raise ValueError("a child call must use token_in mode with prev_len > 0")
    if delta_len == 0:
        raise ValueError("a staged call delta must contain at least one token")
    if delta_len != len(token_ids_delta):
        raise ValueError(f"delta_len {delta_len} does not match {len(token_ids_delta)} token IDs")
    if not len(token_ids_delta) == len(token_mask_delta) == len(generation_log_probs_delta):
        raise ValueError("token IDs, masks and log-probabilities differ in length")
    if any(m not in (0.0, 1.0) for m in token_mask_delta):
        raise ValueError("token_mask_delta must contain only 0.0 or 1.0")
    if any(
        m == 0.0 and lp != 0.0 for m, lp in zip(token_mask_delta, generation_log_probs_delta, strict=True)
    ):
        raise ValueError("prompt-carry log probabilities must be 0.0")
    if cum_len != prev_len + delta_len:
        raise ValueError(f"cum_len {cum_len} is not prev_len + delta_len ({prev_len + delta_len})")


def compute_staging_digest(
    *,
    schema_version: int,
    digest_version: int,
    extras_digest_version: int,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids_delta: Sequence[int],
    token_mask_delta: Sequence[float],
    generation_log_probs_delta: Sequence[float],
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
) -> str:
    """The version-2 digest of one staged call."""
    for name, got, want in (
        ("schema", schema_version, STAGING_SCHEMA_VERSION),
        ("digest", digest_version, STAGING_DIGEST_VERSION),
        ("extras digest", extras_digest_version, EXTRAS_DIGEST_VERSION),
    ):
        if type(got) is not int or got != want:
            raise ValueError(f"unsupported staging {name} version {got}")
    if not rollout_id or not model_call_id:
        raise ValueError("rollout_id and model_call_id must be non-empty")
    check_delta(
        parent_call_id=parent_call_id, mode=mode, prev_len=prev_len, delta_len=delta_len, cum_len=cum_len,
        token_ids_delta=token_ids_delta, token_mask_delta=token_mask_delta,
        generation_log_probs_delta=generation_log_probs_delta,
    )  # fmt: skip
    _check_hex_digest(extras_digest, "extras_digest")
    for name, value in (("chain_hash", chain_hash), ("cumulative_hash", cumulative_hash)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a digest string")
        _check_hex_digest(value, name)
    payload = b"".join(
        [
            struct.pack(">BBB", schema_version, digest_version, extras_digest_version),
            _text(rollout_id),
            _text(model_call_id),
            b"\x00" if parent_call_id is None else b"\x01" + _text(parent_call_id),
            _text(mode),
            _u64(prev_len, "prev_len"),
            _u64(delta_len, "delta_len"),
            _u64(cum_len, "cum_len"),
            _u64(weight_version, "weight_version"),
            _sized(encode_token_ids(token_ids_delta)),
            _sized(_float32s(token_mask_delta, "token_mask_delta")),
            _sized(_float32s(generation_log_probs_delta, "generation_log_probs_delta")),
            bytes.fromhex(extras_digest),
            b"\x01" + bytes.fromhex(chain_hash),
            b"\x01" + bytes.fromhex(cumulative_hash),
        ]
    )
    return hashlib.sha256(_CALL_DOMAIN + payload).hexdigest()


def build_staging_delta(
    *,
    prompt_token_ids: list[int],
    generated_token_ids: list[int],
    generated_log_probs: list[float],
    prev_len: int,
) -> tuple[list[int], list[float], list[float]]:
    """The next delta: the prompt past ``prev_len`` (mask 0, log-prob 0.0), then the generation (mask 1)."""
    if not 0 <= prev_len <= len(prompt_token_ids):
        raise ValueError(f"prev_len={prev_len} is outside the prompt's length {len(prompt_token_ids)}")
    if len(generated_token_ids) != len(generated_log_probs):
        raise ValueError(
            f"generated token and log-probability lengths differ: {len(generated_token_ids)} != {len(generated_log_probs)}"
        )
    carry = prompt_token_ids[prev_len:]
    ids = carry + generated_token_ids
    if not ids:
        raise ValueError("a staging delta must contain at least one token")
    return (
        ids,
        [0.0] * len(carry) + [1.0] * len(generated_token_ids),
        [0.0] * len(carry) + list(generated_log_probs),
    )
