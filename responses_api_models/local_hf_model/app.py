"""local_hf_model: a CPU engine speaking vLLM's Chat Completions dialect, backed by transformers.

It is what tests and laptops use in place of vLLM. It serves:

- ``POST /v1/chat/completions``: the chat template (with tools) via ``apply_chat_template``,
  sampling (temperature, top_p, top_k, seed), ``max_tokens`` clamped to the context window,
  a prompt over the window answered with HTTP 400 in vLLM's "maximum context length" wording,
  ``<tool_call>{json}</tool_call>`` parsed into ``tool_calls``, ``<think>`` into
  ``reasoning_content``, ``logprobs``/``top_logprobs``, and vLLM's token-ID fields
  (``return_token_ids`` → ``prompt_token_ids`` and ``choices[0].token_ids``;
  ``return_tokens_as_token_ids`` → logprob tokens spelled ``token_id:<id>``).
- The token-ID splice: when messages carry ``prompt_token_ids``/``generation_token_ids`` from
  earlier calls, the prompt is built by :func:`nemo_gym.models.token_ids.spliced_prompt_token_ids`;
  when that splice is refused the answer carries ``token_ids_contiguous: false``.
- ``POST /tokenize`` (vLLM's), ``GET /v1/models``, ``GET /health``, and ``POST /v1/responses``
  (the Responses API through the same conversion ``vllm_model`` uses, in-process).

Generation runs on one worker thread, off the event loop; requests queue for it. With
``stream: true`` the chunks (and the Responses events made from them) go out as the tokens are
generated (:mod:`responses_api_models.local_hf_model.streaming`); a client that disconnects
stops its generation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import orjson
from pydantic import Field, model_validator
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.base_responses_api_model import (
    TOKEN_ID_FIELDS,
    BaseResponsesAPIModelConfig,
    ChatBridge,
    HTTPError,
    PromptTokenCache,
    SimpleResponsesAPIModel,
    TokenSpliceError,
    detect_turn_end_token_ids,
    is_context_length_error,
    media_kind,
    render_chat_token_ids,
    spliced_prompt_token_ids,
    template_messages,
)
from responses_api_models.local_hf_model import scoring, weights
from responses_api_models.local_hf_model.engine import (
    Generation,
    HFCausalLM,
    SamplingSettings,
    teacher_forced,
)
from responses_api_models.local_hf_model.streaming import stream_chat_completion_live, stream_responses_live
from responses_api_models.local_hf_model.teacher_forcing import ScriptBook, TeacherScript, load_scripts

logger = logging.getLogger(__name__)

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_MAX_TOP_LOGPROBS = 20
# Request fields this engine cannot honour; silently ignoring them would sample from a
# different distribution than the caller asked for.
_UNSUPPORTED_IF_SET: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "min_tokens": 0,
    "best_of": 1,
    "echo": False,
    "continue_final_message": False,
    "prompt_logprobs": None,
    "logit_bias": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "structured_outputs": None,
}


class LocalHFModelConfig(BaseResponsesAPIModelConfig):
    """Config of the CPU engine (see README.md for every field)."""

    model: str | None = None
    tiny: bool = False
    tiny_template: Literal["chatml", "qwen3", "llama3", "chatml_vision"] = "chatml"
    tiny_seed: int = 0
    served_model_name: str | None = None
    max_model_len: int | None = Field(default=None, gt=0)
    default_max_tokens: int | None = Field(default=None, gt=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    torch_num_threads: int | None = Field(default=None, gt=0)
    trust_remote_code: bool = False
    tool_call_parser: Literal["hermes", "llama3_json", "none"] = "hermes"
    reasoning_parser: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    turn_end_token_ids: list[int] | None = None
    forced_completions: list[str] | None = None
    # Scripted turns emitted teacher-forced (see teacher_forcing.py): inline, or from a file.
    teacher_forced_scripts: list[TeacherScript] | None = None
    teacher_forced_script_file: str | None = None
    return_token_id_information: bool = False
    # Accept image and video parts: the chat template renders their placeholder tokens (a text
    # model here does not read pixels; tiny_template chatml_vision is such a template).
    vision: bool = False
    limit_mm_per_prompt: dict[str, int] | None = None
    # POST /update_weights_from_disk: a trainer on this machine hands over its updated policy.
    weight_updates: bool = False
    # Reuse a rollout's prompt tokenization from call to call (nemo_gym/models/prompt_token_cache.py):
    # the IDs are the same, a call tokenizes only what is new. At most this many token IDs are kept.
    prompt_token_cache: bool = True
    prompt_token_cache_max_tokens: int = Field(default=16_000_000, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LocalHFModelConfig:
        if self.tiny == bool(self.model):
            raise ValueError(
                "give exactly one of model (a Hugging Face hub name or local checkpoint path) and tiny: true"
            )
        if self.teacher_forced_scripts is not None and self.teacher_forced_script_file is not None:
            raise ValueError("give teacher_forced_scripts or teacher_forced_script_file, not both")
        return self

    def script_book(self) -> ScriptBook | None:
        """The teacher-forced scripts (None when there are none); a bad file is a ``ValueError``."""
        scripts = self.teacher_forced_scripts
        if self.teacher_forced_script_file is not None:
            scripts = load_scripts(self.teacher_forced_script_file)
        return ScriptBook(scripts) if scripts else None


class LocalHFModel(SimpleResponsesAPIModel):
    """The CPU engine server (see the module docstring)."""

    config: LocalHFModelConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        if config.torch_num_threads:
            import torch

            torch.set_num_threads(config.torch_num_threads)
        path = config.model
        if config.tiny:
            from nemo_gym.base_responses_api_model import build_tiny_model

            path = str(build_tiny_model(template=config.tiny_template, seed=config.tiny_seed))
        assert path is not None
        self.lm = HFCausalLM.load(
            path,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            trust_remote_code=config.trust_remote_code,
        )
        self.served_model_name = config.served_model_name or (
            f"tiny-{config.tiny_template}" if config.tiny else path
        )
        self.script_book = config.script_book()
        self.forced_ids = [
            self.lm.tokenizer.encode(text, add_special_tokens=False)
            for text in config.forced_completions or []
        ]
        self.bridge = ChatBridge(
            model=self.served_model_name,
            return_token_id_information=config.return_token_id_information,
            limit_mm_per_prompt=config.limit_mm_per_prompt,
        )
        self.prompt_tokens = self._prompt_token_cache()
        self.requests_served = 0
        self.weights_version = 0  # counts /update_weights_from_disk loads
        # When the last generation ended (time.monotonic()): streaming tests compare event times with it.
        self.last_generation_end: float | None = None
        # One thread: the model is not safe to run concurrently, and the CPU is the bottleneck.
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

    def _prompt_token_cache(self) -> PromptTokenCache | None:
        if not self.config.prompt_token_cache:
            return None
        tokenizer = self.lm.tokenizer
        try:
            turn_end = self.config.turn_end_token_ids or detect_turn_end_token_ids(tokenizer)
        except TokenSpliceError:
            return None
        cache = PromptTokenCache(tokenizer, turn_end, max_tokens=self.config.prompt_token_cache_max_tokens)
        if not cache.enabled:
            logger.info(
                "%s: this tokenizer's turn ends are not split on first; prompts are not reused", self.name
            )
            return None
        return cache

    async def _delete_response(self, request: Any) -> Response:
        """The rollout ended (its agent forgets the kept conversation): forget its prompt tokens too."""
        if self.prompt_tokens is not None and self.rollout_id is not None:
            self.prompt_tokens.free(self.rollout_id)
        return await super()._delete_response(request)

    def routes(self) -> list[Route]:
        """The model-server routes plus vLLM's ``/tokenize`` and ``/health``."""
        return super().routes() + [
            self.route("/tokenize", self.tokenize),
            self.route("/detokenize", self.detokenize),
            self.route("/v1/completions", self.completions),
            self.route("/health", self.health, methods=("GET",)),
            self.route("/update_weights_from_disk", self.update_weights_from_disk),
        ]

    async def on_shutdown(self) -> None:
        """Stop the generation thread."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    # ---- routes --------------------------------------------------------------------------
    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """A vLLM-style chat completion (see the module docstring)."""
        request = ChatRequest(body, self)
        loop = asyncio.get_running_loop()
        self.requests_served += 1
        return await loop.run_in_executor(self.executor, request.run)

    async def chat_completions_stream(self, body: dict[str, Any]) -> Response:
        """Chat completion chunks sent as the tokens are generated (see :mod:`.streaming`)."""
        return await stream_chat_completion_live(self, body)

    async def responses_stream(self, body: dict[str, Any]) -> Response:
        """Responses events sent as the tokens are generated; the last one carries the response
        converted from the whole completion, exactly as :meth:`responses` answers."""
        return await stream_responses_live(self, body)

    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Responses API over this engine, converted in-process."""
        chat_request = self.bridge.chat_request(body)
        try:
            completion = await self.chat_completions(chat_request)
        except HTTPError as exc:
            if is_context_length_error(exc.status_code, exc.message):
                return self.bridge.context_exceeded_response(body, exc.message)
            raise
        return self.bridge.response(completion, body)

    async def count_input_tokens(self, body: dict[str, Any]) -> int:
        """The prompt's length under this model's chat template (what the engine would feed)."""
        chat = self.bridge.chat_request(body)
        answer = await self.tokenize(
            {k: chat[k] for k in ("messages", "tools", "chat_template_kwargs") if chat.get(k)}
        )
        return int(answer["count"])

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``/tokenize``: ``{prompt}`` or ``{messages, tools?, add_generation_prompt?}``."""
        tokenizer = self.lm.tokenizer
        if isinstance(body.get("prompt"), str):
            ids = tokenizer.encode(
                body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True))
            )
        elif isinstance(body.get("messages"), list):
            messages = checked_messages(body["messages"])
            kwargs = {**(self.config.chat_template_kwargs or {}), **(body.get("chat_template_kwargs") or {})}
            try:
                ids = render_chat_token_ids(
                    messages,
                    tokenizer,
                    body.get("tools"),
                    kwargs,
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                )
            except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
                raise HTTPError(400, f"the chat template cannot render these messages: {exc}") from exc
        else:
            raise HTTPError(400, "tokenize needs 'prompt' (a string) or 'messages' (a list)")
        return {"count": len(ids), "max_model_len": self.lm.max_model_len, "tokens": ids, "token_strs": None}

    async def update_weights_from_disk(self, body: dict[str, Any]) -> dict[str, Any]:
        """SGLang's ``/update_weights_from_disk``: ``{model_path}`` (a ``save_pretrained`` folder of
        safetensors) becomes the served weights, between two generations (see ``weights.py``)."""
        if not self.config.weight_updates:
            raise HTTPError(
                403, "weight updates are off for this engine: set weight_updates: true in its config"
            )
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise HTTPError(400, "update_weights_from_disk needs 'model_path' (a folder of *.safetensors)")

        def load() -> int:
            return weights.load_weights(self.lm.model, weights.read_checkpoint_tensors(path))

        try:
            count = await asyncio.get_running_loop().run_in_executor(self.executor, load)
        except weights.WeightsError as exc:
            raise HTTPError(400, str(exc)) from exc
        self.weights_version += 1
        return {
            "success": True,
            "message": f"loaded {count} tensors from {path}",
            "weights_version": self.weights_version,
        }

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``/detokenize``: ``{tokens}`` -> ``{prompt}`` (special tokens kept)."""
        ids = scoring.detokenize_request(body)
        return {"prompt": self.lm.tokenizer.decode(ids, skip_special_tokens=False)}

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's ``/v1/completions`` in its scoring form only (see ``scoring.py``)."""
        ids = scoring.scoring_request(body, len(self.lm.tokenizer), self.lm.max_model_len)
        loop = asyncio.get_running_loop()
        scores = await loop.run_in_executor(self.executor, scoring.prompt_logprobs, self.lm.model, ids)
        return scoring.completion_answer(self.served_model_name, ids, scores, self.lm.tokenizer.decode)

    async def models(self, body: Any) -> dict[str, Any]:
        """vLLM's model list: the one served model."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "nemo_gym",
                    "max_model_len": self.lm.max_model_len,
                }
            ],
        }

    async def health(self, body: Any) -> dict[str, Any]:
        """Liveness, at vLLM's path."""
        return {"status": "ok"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """:func:`template_messages`, with a malformed message answered by HTTP 400."""
    try:
        return template_messages(messages)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from exc


def context_length_message(max_model_len: int, prompt_tokens: int) -> str:
    """vLLM's wording for a prompt that leaves no room in the context window."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your request has "
        f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
    )


class ChatRequest:
    """One validated chat completion request, run on the generation thread by :meth:`run`."""

    def __init__(self, body: dict[str, Any], server: LocalHFModel) -> None:
        self.server = server
        self.config = server.config
        self.lm = server.lm
        self.body = body
        self._validate()
        self.messages = checked_messages(body["messages"])
        self.tools = body.get("tools") or None
        self.parse_tools = bool(self.tools) and body.get("tool_choice") != "none"
        self.template_kwargs = {
            **(self.config.chat_template_kwargs or {}),
            **(body.get("chat_template_kwargs") or {}),
        }
        cache = server.prompt_tokens
        # On the loop (the rollout id is the request's): the generation thread does not see it.
        self.encode = cache.encoder(server.rollout_id) if cache is not None else None
        self.want_logprobs = bool(body.get("logprobs"))
        self.top_n = int(body.get("top_logprobs") or 0) if self.want_logprobs else 0
        self.ids_as_text = bool(body.get("return_tokens_as_token_ids"))
        self.return_token_ids = bool(body.get("return_token_ids"))
        stop = body.get("stop") or []
        self.stop_strings = [stop] if isinstance(stop, str) else list(stop)
        top_k = body.get("top_k")
        self.sampling = SamplingSettings(
            temperature=float(1.0 if body.get("temperature") is None else body["temperature"]),
            top_p=float(1.0 if body.get("top_p") is None else body["top_p"]),
            top_k=int(top_k) if top_k is not None and top_k > 0 else 0,
            seed=body.get("seed"),
        )

    def _validate(self) -> None:
        body = self.body
        model = body.get("model")
        if model and model not in (self.server.served_model_name, self.config.model):
            raise HTTPError(
                404,
                f"The model `{model}` does not exist (this engine serves `{self.server.served_model_name}`).",
            )
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HTTPError(400, "'messages' must be a non-empty list")
        if body.get("n") not in (None, 1):
            raise HTTPError(400, f"n={body['n']!r} is not supported by local_hf_model (one sample per call)")
        if not self.config.vision:
            self._refuse_media(body["messages"])
        for key, default in _UNSUPPORTED_IF_SET.items():
            if body.get(key) not in (None, default) and body.get(key) != {}:
                raise HTTPError(400, f"{key}={body[key]!r} is not supported by local_hf_model")
        response_format = body.get("response_format")
        if response_format and (
            not isinstance(response_format, dict) or response_format.get("type") != "text"
        ):
            raise HTTPError(
                400, "response_format other than text (guided decoding) is not supported by local_hf_model"
            )
        top_logprobs = body.get("top_logprobs")
        if top_logprobs is not None and not (
            isinstance(top_logprobs, int) and 0 <= top_logprobs <= _MAX_TOP_LOGPROBS
        ):
            raise HTTPError(400, f"top_logprobs must be an integer from 0 to {_MAX_TOP_LOGPROBS}")
        for key in ("temperature", "top_p"):
            value = body.get(key)
            if value is not None and (not isinstance(value, int | float) or value < 0):
                raise HTTPError(400, f"{key} must be a non-negative number, got {value!r}")
        if body.get("top_p") is not None and not 0 < body["top_p"] <= 1:
            raise HTTPError(400, f"top_p must be in (0, 1], got {body['top_p']!r}")
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if value is not None and (not _is_int(value) or value < 1):
                raise HTTPError(400, f"{key} must be a positive integer, got {value!r}")
        for key in ("top_k", "seed"):
            if body.get(key) is not None and not _is_int(body[key]):
                raise HTTPError(400, f"{key} must be an integer, got {body[key]!r}")
        for key in ("stop_token_ids",):
            value = body.get(key)
            if value is not None and (not isinstance(value, list) or not all(_is_int(i) for i in value)):
                raise HTTPError(400, f"{key} must be a list of integers")
        stop = body.get("stop")
        if stop is not None and not (
            isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
        ):
            raise HTTPError(400, "stop must be a string or a list of strings")

    # ---- on the generation thread --------------------------------------------------------
    def _refuse_media(self, messages: list[Any]) -> None:
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            for part_index, part in enumerate(content if isinstance(content, list) else []):
                kind = media_kind(part) if isinstance(part, dict) else None
                if kind is not None:
                    raise HTTPError(
                        400,
                        f"messages[{index}].content[{part_index}] is a{'n' if kind == 'image' else ''} {kind} part, "
                        f"but this local_hf_model serves a text-only model; configure a vision model "
                        "(vision: true with a multimodal chat template, e.g. tiny_template: chatml_vision) "
                        "or send text only",
                    )

    def run(self) -> dict[str, Any]:
        """Build the prompt, generate, and return the chat completion dict."""
        self.prepare()
        return self.generate()

    def prepare(self) -> None:
        """Build the prompt and the generation limits (HTTP 400 for a prompt that does not fit)."""
        self.prompt_ids, self.contiguous = self._prompt_ids()
        window = self.lm.max_model_len
        if len(self.prompt_ids) >= window:
            raise HTTPError(400, context_length_message(window, len(self.prompt_ids)))
        room = window - len(self.prompt_ids)
        asked = (
            self.body.get("max_completion_tokens")
            or self.body.get("max_tokens")
            or self.config.default_max_tokens
        )
        self.max_tokens = min(int(asked), room) if asked else room
        stop_ids = set() if self.body.get("ignore_eos") else self.lm.stop_token_ids()
        stop_ids.update(self.config.turn_end_token_ids or [])
        stop_ids.update(int(i) for i in self.body.get("stop_token_ids") or [])
        self.stop_ids = stop_ids

    def generate(
        self, on_token: Callable[[int], None] | None = None, cancelled: threading.Event | None = None
    ) -> dict[str, Any]:
        """Generate after :meth:`prepare`; ``on_token`` sees each token as it is sampled, and
        ``cancelled`` (set when a streaming client went away) ends the generation early."""
        scripted = self._scripted_ids()
        if scripted is not None:
            return self._teacher_forced(scripted, on_token)
        stop_check = self._hit_stop_string if self.stop_strings else None
        if cancelled is not None:
            strings = stop_check

            def stop_check(generated: list[int]) -> bool:
                return cancelled.is_set() or (strings is not None and strings(generated))

        generation = self.lm.generate(
            self.prompt_ids,
            max_tokens=self.max_tokens,
            sampling=self.sampling,
            stop_token_ids=self.stop_ids,
            top_n=self.top_n,
            forced_ids=self._forced_ids(self.stop_ids),
            stop_check=stop_check,
            on_token=on_token,
        )
        self.server.last_generation_end = time.monotonic()
        return self._completion(self.prompt_ids, self.contiguous, generation, self.stop_ids)

    def _prompt_ids(self) -> tuple[list[int], bool]:
        tokenizer = self.lm.tokenizer
        try:
            if any(m.get(key) is not None for m in self.messages for key in TOKEN_ID_FIELDS[:2]):
                ids, contiguous = spliced_prompt_token_ids(
                    self.messages,
                    tokenizer,
                    self.tools,
                    self.template_kwargs,
                    self.config.turn_end_token_ids,
                    encode=self.encode,
                )
            else:
                ids = render_chat_token_ids(
                    self.messages,
                    tokenizer,
                    self.tools,
                    self.template_kwargs,
                    add_generation_prompt=bool(self.body.get("add_generation_prompt", True)),
                    encode=self.encode,
                )
                contiguous = True
        except HTTPError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template that cannot render is the request's fault
            raise HTTPError(400, f"the chat template cannot render these messages: {exc}") from exc
        vocab = self.lm.model.get_input_embeddings().num_embeddings
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise HTTPError(400, f"prompt token ID {bad} is outside the vocabulary (0..{vocab - 1})")
        return ids, contiguous

    def _scripted_ids(self) -> list[int] | None:
        """The teacher-forced IDs of the script's turn for this call (None: no script matches)."""
        book = self.server.script_book
        turn = book.turn_for(self.messages) if book is not None else None
        if turn is None or book is None:
            return None
        turn_end = self.config.turn_end_token_ids or sorted(self.lm.stop_token_ids())
        try:
            return book.forced_ids(
                turn, self.messages, self.lm.tokenizer, self.tools, self.template_kwargs, turn_end
            )
        except ValueError as exc:
            raise HTTPError(500, f"the scripted turn cannot be rendered: {exc}") from exc

    def _teacher_forced(self, ids: list[int], on_token: Callable[[int], None] | None) -> dict[str, Any]:
        """The scripted turn's tokens (cut at the request's ``max_tokens``) with the model's logprobs."""
        generation = teacher_forced(self.lm, self.prompt_ids, ids[: self.max_tokens], top_n=self.top_n)
        if len(ids) > self.max_tokens:
            generation.finish_reason = "length"
        for token in generation.token_ids:
            if on_token is not None:
                on_token(token)
        self.server.last_generation_end = time.monotonic()
        return self._completion(self.prompt_ids, self.contiguous, generation, self.stop_ids)

    def _forced_ids(self, stop_ids: set[int]) -> list[int] | None:
        # The n-th forced completion answers the call whose history holds n assistant turns,
        # which makes the hook stateless: call k of every rollout gets completion k.
        index = sum(1 for message in self.messages if message.get("role") == "assistant")
        if index >= len(self.server.forced_ids):
            return None
        turn_end = self.config.turn_end_token_ids or sorted(self.lm.stop_token_ids())
        return self.server.forced_ids[index] + turn_end[:1]

    def _hit_stop_string(self, generated: list[int]) -> bool:
        # Earlier tokens were checked already, so only a tail long enough to hold the newest
        # possible match needs decoding (every token is at least one character or byte).
        window = max(len(stop) for stop in self.stop_strings) + 4
        text = self.lm.decode(generated[-window:])
        return any(stop in text for stop in self.stop_strings)

    def _completion(
        self, prompt_ids: list[int], contiguous: bool, generation: Generation, stop_ids: set[int]
    ) -> dict[str, Any]:
        ids = generation.token_ids
        text_ids = ids[:-1] if ids and ids[-1] in stop_ids and generation.finish_reason == "stop" else ids
        text = self.lm.decode(text_ids)
        if self.stop_strings and generation.finish_reason == "stop":
            text = self._cut_at_stop_string(text)
        message, called_tools = self._parse_message(text)
        finish_reason = generation.finish_reason
        if called_tools and finish_reason == "stop":
            finish_reason = "tool_calls"
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(generation) if self.want_logprobs else None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.served_model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
            },
        }
        if self.return_token_ids:
            completion["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(ids)
        if not contiguous:
            completion["token_ids_contiguous"] = False
        return completion

    def _cut_at_stop_string(self, text: str) -> str:
        positions = [(text.find(stop), stop) for stop in self.stop_strings if stop in text]
        if not positions:
            return text
        position, stop = min(positions)
        keep = bool(self.body.get("include_stop_str_in_output"))
        return text[: position + (len(stop) if keep else 0)]

    def _parse_message(self, text: str) -> tuple[dict[str, Any], bool]:
        message: dict[str, Any] = {"role": "assistant"}
        content: str | None = text
        if self.config.reasoning_parser and _THINK_CLOSE in text:
            reasoning, _, content = text.partition(_THINK_CLOSE)
            message["reasoning_content"] = reasoning.split(_THINK_OPEN, 1)[-1]
        tool_calls: list[dict[str, Any]] = []
        if self.parse_tools and content:
            content, tool_calls = parse_tool_calls(content, self.config.tool_call_parser)
        # vLLM answers content=None beside tool calls when the model wrote no other text.
        message["content"] = (content or None) if tool_calls else (content or "")
        message["tool_calls"] = tool_calls
        return message, bool(tool_calls)

    def _logprobs(self, generation: Generation) -> dict[str, Any]:
        def spelled(token_id: int) -> str:
            if self.ids_as_text:
                return f"token_id:{token_id}"
            return self.lm.tokenizer.decode([token_id], skip_special_tokens=False)

        content = []
        for token_id, logprob, top in zip(
            generation.token_ids, generation.logprobs, generation.top_logprobs, strict=True
        ):
            token = spelled(token_id)
            content.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": spelled(i), "logprob": lp, "bytes": list(spelled(i).encode())}
                        for i, lp in top
                    ],
                }
            )
        return {"content": content}


def parse_tool_calls(text: str, parser: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model text into (content, tool_calls) with the ``hermes`` or ``llama3_json`` format.

    Text that does not parse completely stays content with no tool calls (as vLLM's parsers do).
    """
    objects: list[Any] = []
    content: str | None = text
    if parser == "hermes":
        start = text.find("<tool_call>")
        if start == -1:
            return text, []
        try:
            objects = [orjson.loads(block.strip()) for block in _TOOL_CALL_BLOCK.findall(text)]
        except orjson.JSONDecodeError:
            return text, []
        content = text[:start]
    elif parser == "llama3_json":
        stripped = text.strip()
        if not stripped.startswith("{"):
            return text, []
        try:
            objects = [orjson.loads(part) for part in stripped.split(";") if part.strip()]
        except orjson.JSONDecodeError:
            return text, []
        content = None
    else:
        return text, []
    calls = []
    for obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        arguments = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    # json, not orjson: vLLM's spacing (", ", ": "), which later renders depend on.
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    return (content if content and content.strip() else None), calls


if __name__ == "__main__":
    LocalHFModel.run_webserver()
