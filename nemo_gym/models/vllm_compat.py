"""Everything that depends on vLLM's version and internals, in one module.

- :func:`check_vllm_version` refuses vLLM versions this module was not written for, with a
  message saying which are supported and how to override.
- :func:`install_token_id_splice` makes vLLM's OpenAI chat endpoint build prompts with
  :func:`nemo_gym.models.token_ids.spliced_prompt_token_ids` when the request's messages carry token
  IDs from earlier calls (the public entry point for trainers patching their own vLLM server).
- :func:`vllm_serve_command` and :func:`main` start ``vllm serve`` in a child process with the
  splice installed: ``python -m nemo_gym.models.vllm_compat
  --splice-model <path> -- serve <model> --port ...``.

How the splice is installed: vLLM validates request messages into typed dicts that drop unknown
keys, so the token-ID fields are read from the raw request body (already buffered by the web
framework) when ``OpenAIServingChat.create_chat_completion`` starts; the spliced IDs are handed
through a context variable to the wrapped ``_preprocess_chat``, whose engine prompts get them as
``prompt_token_ids``. Both are methods vLLM has had with these roles from 0.10.2 (the first
version with ``return_token_ids``) through 0.11.x; later versions moved chat rendering into a
renderer and need this module updated (the version check says so instead of failing
mysteriously). Only the API-server process is patched, so ``--api-server-count`` must stay 1.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import importlib.metadata
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

MIN_VERSION = (0, 10, 2)
"""The first vLLM with ``return_token_ids`` (prompt and generated IDs in chat completions)."""
MAX_VERSION_EXCLUSIVE = (0, 12, 0)
"""The first vLLM whose chat preprocessing this module has not been written for."""
SUPPORTED_RANGE = ">=0.10.2,<0.12"

_SPLICED: contextvars.ContextVar[tuple[list[int], bool] | None] = contextvars.ContextVar(
    "nemo_gym_spliced_prompt", default=None
)


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM is missing or outside :data:`SUPPORTED_RANGE`."""


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.10.2.post1+cu128"`` → ``(0, 10, 2)``; raises ``ValueError`` on text that is not a version."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not match:
        raise ValueError(f"{version!r} is not a version number")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version string, or None when vLLM is not installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_vllm_version(version: str | None = None, *, allow_unsupported: bool = False) -> str:
    """Return the vLLM version (the installed one when ``version`` is None) if it is supported.

    Raises:
        UnsupportedVLLMVersion: vLLM is not installed, the version cannot be read, or it is
            outside :data:`SUPPORTED_RANGE` (unless ``allow_unsupported``, which only logs).
    """
    found = installed_vllm_version() if version is None else version
    if found is None:
        raise UnsupportedVLLMVersion(
            f"vLLM is not installed; local_vllm_model needs vllm{SUPPORTED_RANGE} on a GPU machine "
            f"(pip install 'vllm{SUPPORTED_RANGE}')"
        )
    try:
        parsed = parse_version(found)
    except ValueError as exc:
        raise UnsupportedVLLMVersion(f"cannot read the vLLM version {found!r}: {exc}") from exc
    if MIN_VERSION <= parsed < MAX_VERSION_EXCLUSIVE:
        return found
    message = (
        f"vLLM {found} is not supported by local_vllm_model (supported: {SUPPORTED_RANGE}); "
        + (
            "versions before 0.10.2 cannot return prompt token IDs"
            if parsed < MIN_VERSION
            else "its chat preprocessing changed; update responses_api_models/local_vllm_model/vllm_compat.py"
        )
        + ". Set allow_unsupported_vllm_version: true to try anyway."
    )
    if allow_unsupported:
        logger.warning("%s Continuing because allow_unsupported_vllm_version is set.", message)
        return found
    raise UnsupportedVLLMVersion(message)


def replace_prompt_token_ids(preprocessed: Any, token_ids: Sequence[int]) -> int:
    """Put ``token_ids`` into every prompt dict found in ``_preprocess_chat``'s result; return how many.

    The result's shape differs by version (``(conversation, request_prompts, engine_prompts)``
    in 0.10, ``(conversation, engine_prompts)`` later); prompt dicts are recognised by their
    ``prompt_token_ids`` key wherever they sit in the tuple's lists.
    """
    replaced = 0
    parts = preprocessed if isinstance(preprocessed, tuple | list) else [preprocessed]
    for part in parts:
        if not isinstance(part, list):
            continue
        for prompt in part:
            if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                prompt["prompt_token_ids"] = list(token_ids)
                replaced += 1
    return replaced


def install_token_id_splice(
    tokenizer: Any,
    *,
    turn_end_token_ids: Iterable[int] | None = None,
    default_chat_template_kwargs: Mapping[str, Any] | None = None,
    allow_unsupported: bool = False,
) -> None:
    """Make this process's vLLM chat endpoint splice token IDs from earlier calls into prompts.

    ``tokenizer`` is the served model's Hugging Face tokenizer (or a path to load it from).
    Call before vLLM's API server starts, in the process that runs it. Idempotent.

    Raises:
        UnsupportedVLLMVersion: see :func:`check_vllm_version`.
    """
    check_vllm_version(allow_unsupported=allow_unsupported)
    from vllm.entrypoints.openai.serving_chat import OpenAIServingChat

    from nemo_gym.models.chat_backend import template_messages
    from nemo_gym.models.token_ids import TOKEN_ID_FIELDS, spliced_prompt_token_ids

    if getattr(OpenAIServingChat, "_nemo_gym_splice_installed", False):
        return
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    turn_end = list(turn_end_token_ids) if turn_end_token_ids is not None else None
    defaults = dict(default_chat_template_kwargs or {})
    original_create = OpenAIServingChat.create_chat_completion
    original_preprocess = OpenAIServingChat._preprocess_chat

    @functools.wraps(original_create)
    async def create_chat_completion(self: Any, request: Any, raw_request: Any = None) -> Any:
        spliced: tuple[list[int], bool] | None = None
        body: dict[str, Any] = {}
        if raw_request is not None:
            try:
                parsed = await raw_request.json()
            except Exception:  # noqa: BLE001 - no readable body: vLLM answers as it would
                parsed = None
            body = parsed if isinstance(parsed, dict) else {}
        messages = body.get("messages")
        if isinstance(messages, list) and any(
            isinstance(m, dict) and m.get(TOKEN_ID_FIELDS[0]) is not None for m in messages
        ):
            kwargs = {**defaults, **(body.get("chat_template_kwargs") or {})}
            spliced = spliced_prompt_token_ids(
                template_messages(messages), tokenizer, body.get("tools"), kwargs, turn_end
            )
        token = _SPLICED.set(spliced)
        try:
            result = await original_create(self, request, raw_request)
        finally:
            _SPLICED.reset(token)
        if spliced is not None and not spliced[1]:
            try:
                # vLLM's response models allow extra fields; the flag tells the trainer.
                result.token_ids_contiguous = False
            except (AttributeError, ValueError, TypeError):
                logger.warning("token-ID splice refused and the response cannot carry token_ids_contiguous")
        return result

    @functools.wraps(original_preprocess)
    async def _preprocess_chat(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original_preprocess(self, *args, **kwargs)
        spliced = _SPLICED.get()
        if spliced is not None and replace_prompt_token_ids(result, spliced[0]) == 0:
            logger.warning("vLLM's preprocessed chat prompt has no prompt_token_ids; splice not applied")
        return result

    OpenAIServingChat.create_chat_completion = create_chat_completion  # type: ignore[method-assign]
    OpenAIServingChat._preprocess_chat = _preprocess_chat  # type: ignore[method-assign]
    OpenAIServingChat._nemo_gym_splice_installed = True  # type: ignore[attr-defined]


def vllm_cli_flags(args: Mapping[str, Any]) -> list[str]:
    """``{tensor_parallel_size: 2, enable_prefix_caching: true}`` → ``--tensor-parallel-size 2 --enable-prefix-caching``.

    ``false`` and ``null`` values leave the flag out; lists repeat the values after one flag;
    mappings are passed as JSON (vLLM parses JSON-valued flags).
    """
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, list | tuple):
            flags.append(flag)
            flags.extend(str(v) for v in value)
        elif isinstance(value, Mapping):
            flags.extend([flag, json.dumps(value)])
        else:
            flags.extend([flag, str(value)])
    return flags


def vllm_serve_command(
    model: str,
    *,
    host: str,
    port: int,
    serve_args: Mapping[str, Any] | None = None,
    splice: bool = True,
    turn_end_token_ids: Sequence[int] | None = None,
    allow_unsupported: bool = False,
) -> list[str]:
    """The child-process command that runs ``vllm serve`` (with the splice installed by :func:`main`)."""
    serve_args = dict(serve_args or {})
    for reserved in ("host", "port", "api_server_count"):
        if reserved in serve_args:
            raise ValueError(
                f"vllm_serve_args.{reserved} is managed by local_vllm_model"
                + (" (the splice patches one API-server process)" if reserved == "api_server_count" else "")
            )
    command = [sys.executable, "-m", "nemo_gym.models.vllm_compat"]
    if splice:
        command += ["--splice-model", model]
        if turn_end_token_ids:
            command += ["--turn-end-token-ids", ",".join(str(i) for i in turn_end_token_ids)]
        if serve_args.get("default_chat_template_kwargs"):
            # The splice must render with the same template arguments vLLM uses.
            command += ["--chat-template-kwargs", json.dumps(serve_args["default_chat_template_kwargs"])]
    if allow_unsupported:
        command.append("--allow-unsupported")
    return [*command, "--", "serve", model, "--host", host, "--port", str(port), *vllm_cli_flags(serve_args)]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry of the vLLM child process: check the version, install the splice, run vLLM's CLI."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splice-model", help="the served model's path or hub name (its tokenizer)")
    parser.add_argument("--turn-end-token-ids", default=None, help="comma-separated turn-end token IDs")
    parser.add_argument("--chat-template-kwargs", default=None, help="JSON defaults for the splice's render")
    parser.add_argument("--allow-unsupported", action="store_true")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then the vllm CLI arguments")
    options = parser.parse_args(argv)
    vllm_args = options.vllm_args[1:] if options.vllm_args[:1] == ["--"] else options.vllm_args
    check_vllm_version(allow_unsupported=options.allow_unsupported)
    if options.splice_model:
        install_token_id_splice(
            options.splice_model,
            turn_end_token_ids=[int(i) for i in options.turn_end_token_ids.split(",")]
            if options.turn_end_token_ids
            else None,
            default_chat_template_kwargs=json.loads(options.chat_template_kwargs)
            if options.chat_template_kwargs
            else None,
            allow_unsupported=options.allow_unsupported,
        )
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *vllm_args]
    vllm_main()


if __name__ == "__main__":
    main()
