"""A tiny, real, offline tokenizer with real chat templates, for tests and the CPU engine.

Nothing here touches the network: the tokenizer is a byte-level BPE trained in a few
milliseconds on a small built-in corpus (English, JSON, Python and chat-template text), so
it has genuine merges and shows the same retokenization drift a production tokenizer shows
(sampling ``"Ski"`` then ``"nny"`` is not what ``"Skinny"`` encodes to). Three chat
templates are offered, each a compact re-implementation of a family seen in practice:

- ``"chatml"``: Qwen2.5 style. ``<|im_start|>role\\n...<|im_end|>\\n`` turns, tools listed in
  the system prompt, assistant tool calls as ``<tool_call>\\n{json}\\n</tool_call>``, tool
  results as ``<tool_response>`` blocks grouped inside one user turn.
- ``"qwen3"``: ``"chatml"`` plus ``<think>...</think>``. Reasoning of assistant turns before the
  last user query is dropped; later turns render ``reasoning_content``. This is the template
  that breaks position-based token splicing, which is why tests need it.
- ``"chatml_vision"``: ``"chatml"`` whose messages may hold image and video parts, rendered as
  Qwen2-VL's placeholders ``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>`` for a
  video), one placeholder token per part: a multimodal template for the token-ID tests.
- ``"llama3"``: Llama 3.1 style. ``<|begin_of_text|>``, ``<|start_header_id|>role<|end_header_id|>``
  headers, ``<|eot_id|>`` turn ends, tool calls as a bare JSON object.

The result is deterministic: every call with the same arguments yields the same vocabulary,
the same IDs and the same template.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Final, Literal

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers as bpe_trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "TEMPLATES",
    "TemplateName",
    "build_tiny_tokenizer",
    "chat_template_source",
    "save_tiny_tokenizer",
    "turn_end_token_ids",
]

TemplateName = Literal["chatml", "qwen3", "llama3", "chatml_vision"]
TEMPLATES: Final[tuple[str, ...]] = ("chatml", "qwen3", "llama3", "chatml_vision")

# Pre-tokenizer patterns of the two families (Qwen2 and Llama 3). They differ in how digits are
# grouped, which matters little here but keeps each family's splitting honest.
_QWEN_PATTERN: Final = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_PATTERN: Final = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_BYTE_ALPHABET_SIZE: Final = 256

# The training corpus. Chat-template scaffolding is in it on purpose, so that role names,
# JSON punctuation and tag text get merges the way they do in a production vocabulary.
_CORPUS: Final[tuple[str, ...]] = (
    "The skinny cat sat on the warm mat and watched the rain fall over the quiet town.",
    "Skinny jeans, skinny lattes and skinny trees: the shop sold everything skinny.",
    "A user asked the assistant for the weather in Paris, and the assistant called a tool.",
    "The assistant thinks step by step before it answers the question of the user.",
    "Let me think about this problem. First, I add the two numbers; then I check the result.",
    "The answer is 42. The answer is correct because the sum of the parts is the whole.",
    "Please solve the following math problem and put the final answer in a box.",
    "She reads books in the morning, writes letters in the afternoon, and sleeps at night.",
    "Reinforcement learning trains a policy model with rewards from a verifier.",
    "The environment returns a reward of one when the answer matches the expected answer.",
    "Tokens, token IDs, prompts and generations: the trainer needs all of them to match.",
    "What is the capital of France? The capital of France is Paris.",
    "What is the temperature in Berlin today? It is sunny and twenty degrees.",
    "I will call the search tool to find the population of the city.",
    "Thank you! You are welcome. Is there anything else I can help you with?",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 100 2024 3.14 -7 1e-3 42",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"name": "search", "arguments": {"query": "population of Tokyo", "top_k": 3}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",'
    ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}},'
    ' "required": ["city"]}}}',
    '{"temperature": 20, "condition": "sunny", "humidity": 0.4, "ok": true, "error": null}',
    '{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}',
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "class Environment:\n    def verify(self, response):\n        return {'reward': 1.0}\n",
    "import json\n\ndata = json.loads(text)\nresult = [x for x in data if x]\n",
    "system\nYou are a helpful assistant.\nuser\nHello!\nassistant\nHello! How can I help?\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
    '<tool_response>\n{"temperature": 20}\n</tool_response>\n',
    "<think>\nThe user wants the weather. I should call the tool.\n</think>\n\n",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n",
    "You are provided with function signatures within <tools></tools> XML tags:\n",
    "For each function call, return a json object with function name and arguments.\n",
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n",
    "Environment: ipython\nYou have access to the following functions.\n",
)

# ---------------------------------------------------------------------------------------------
# Chat templates, written for transformers' Jinja sandbox (which provides ``tojson``). Content
# may be a string, None, or a list of OpenAI text parts; the ``render_content`` macro flattens
# all three the way vLLM does for string-format templates.
# ---------------------------------------------------------------------------------------------

_CONTENT_MACRO: Final = (
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}{%- if part.text is defined -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
)

# Qwen2-VL style: an image or video part becomes its placeholder between vision tags.
_VISION_CONTENT_MACRO: Final = (
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type in ('image_url', 'image', 'input_image') -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part.type in ('video_url', 'video', 'input_video') -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part.text is defined -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
)

# The tools block and tool-call rendering shared by the ChatML-family templates.
_CHATML_TOOLS_BLOCK: Final = (
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>\' }}'
)

_CHATML_TOOL_CALL: Final = (
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
)

# Consecutive tool messages share one user turn, as in Qwen's templates.
_CHATML_TOOL_MESSAGE: Final = (
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- render_content(message.content) }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
)

_CHATML_TEMPLATE: Final = (
    _CONTENT_MACRO + "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system_message = render_content(messages[0].content) %}"
    "{%- else %}{%- set system_message = 'You are a helpful assistant.' %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + system_message }}"
    "{%- if tools %}{{- '\\n\\n' }}" + _CHATML_TOOLS_BLOCK + "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- set content = render_content(message.content) %}"
    "{%- if content %}{{- '\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}{{- '\\n' }}"
    + _CHATML_TOOL_CALL
    + "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}" + _CHATML_TOOL_MESSAGE + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3: reasoning survives only for assistant turns after the last real user query (a user
# turn that is not just wrapped tool output). Earlier turns lose their <think> block, which
# shortens the re-rendered history: the reason token splicing must count turns, not positions.
_QWEN3_TEMPLATE: Final = (
    _CONTENT_MACRO + "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- render_content(messages[0].content) + '\\n\\n' }}{%- endif %}"
    + _CHATML_TOOLS_BLOCK
    + "{{- '<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages | length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages | length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set text = render_content(message.content) %}"
    "{%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = render_content(message.content) %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    + _CHATML_TOOL_CALL
    + "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}" + _CHATML_TOOL_MESSAGE + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Llama 3.1: a system turn is always present (with the knowledge-cutoff preamble), content is
# trimmed, tool results come back in an ``ipython`` turn.
_LLAMA3_TEMPLATE: Final = (
    _CONTENT_MACRO + "{{- '<|begin_of_text|>' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system_message = render_content(messages[0].content) | trim %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{%- if tools %}"
    "{{- 'You have access to the following functions. To call a function, respond with a JSON object '"
    ' + \'of the form {"name": function name, "parameters": dictionary of argument name and its value}.\''
    " + '\\n\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson(indent=4) + '\\n\\n' }}{%- endfor %}"
    "{%- endif %}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}' }}"
    "{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'tool' or message.role == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + render_content(message.content) + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n'"
    " + (render_content(message.content) | trim) + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_CHAT_TEMPLATES: Final[dict[str, str]] = {
    "chatml": _CHATML_TEMPLATE,
    "chatml_vision": _VISION_CONTENT_MACRO + _CHATML_TEMPLATE[len(_CONTENT_MACRO) :],
    "qwen3": _QWEN3_TEMPLATE,
    "llama3": _LLAMA3_TEMPLATE,
}

# Special tokens: (content, is_special). Non-special added tokens (tool and think tags) still
# encode as one ID each, but survive ``decode(skip_special_tokens=True)``, as in Qwen's vocab.
_CHATML_ADDED: Final[tuple[tuple[str, bool], ...]] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
_ADDED_TOKENS: Final[dict[str, tuple[tuple[str, bool], ...]]] = {
    "chatml": _CHATML_ADDED,
    "qwen3": _CHATML_ADDED + (("<think>", False), ("</think>", False)),
    "chatml_vision": _CHATML_ADDED
    + (
        ("<|vision_start|>", True),
        ("<|vision_end|>", True),
        ("<|image_pad|>", True),
        ("<|video_pad|>", True),
    ),
    "llama3": (
        ("<|begin_of_text|>", True),
        ("<|end_of_text|>", True),
        ("<|start_header_id|>", True),
        ("<|end_header_id|>", True),
        ("<|eot_id|>", True),
        ("<|eom_id|>", True),
        ("<|python_tag|>", True),
    ),
}

# Role tokens passed to transformers, and the tokens that end one turn in the template.
_ROLE_TOKENS: Final[dict[str, dict[str, str]]] = {
    "chatml": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "chatml_vision": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"},
}
_TURN_END_TOKENS: Final[dict[str, tuple[str, ...]]] = {
    "chatml": ("<|im_end|>",),
    "qwen3": ("<|im_end|>",),
    "chatml_vision": ("<|im_end|>",),
    "llama3": ("<|eot_id|>",),
}


def _check_template(template: str) -> None:
    if template not in _CHAT_TEMPLATES:
        raise ValueError(
            f"unknown tiny tokenizer template {template!r}; choose one of {', '.join(TEMPLATES)}"
        )


def chat_template_source(template: str = "chatml") -> str:
    """Return the Jinja source of one of the tiny chat templates (``chatml``, ``qwen3``, ``llama3``)."""
    _check_template(template)
    return _CHAT_TEMPLATES[template]


@functools.lru_cache(maxsize=16)
def _trained_tokenizer_json(template: str, vocab_size: int) -> str:
    """Train the BPE once per (family, size) and keep its JSON; callers get fresh copies.

    The JSON, not the object, is cached because tokenizers are mutable (``add_tokens``,
    truncation, padding) and one test must not see another's changes.
    """
    pattern = _LLAMA3_PATTERN if template == "llama3" else _QWEN_PATTERN
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = bpe_trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    # Repeating the corpus changes nothing about which merges exist, only their counts; three
    # copies are plenty to make frequent pairs clearly frequent.
    tokenizer.train_from_iterator(list(_CORPUS) * 3, trainer=trainer)
    trained_size = tokenizer.get_vocab_size(with_added_tokens=False)
    if trained_size < vocab_size:
        # A silently smaller vocabulary would surprise whoever sizes a model from vocab_size.
        raise ValueError(
            f"vocab_size={vocab_size} is more than the built-in corpus can fill ({trained_size} "
            f"tokens); use a vocab_size of at most {trained_size}"
        )
    # Added tokens go after the trained vocabulary, one at a time and in order, so their IDs are
    # stable for a given size. ``add_special_tokens`` would mark every one special (and
    # ``decode(skip_special_tokens=True)`` would then drop tags like <tool_call> from text), so
    # tags go through ``add_tokens`` and only true control tokens are special.
    for content, special in _ADDED_TOKENS[template]:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            tokenizer.add_special_tokens([added])
        else:
            tokenizer.add_tokens([added])
    if template == "llama3":
        # Like the real Llama 3 tokenizer: plain ``encode`` prepends <|begin_of_text|>, which is
        # exactly the double-BOS trap engines must avoid (chat prompts are encoded without it).
        bos = "<|begin_of_text|>"
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))],
        )
    return tokenizer.to_str()


def build_tiny_tokenizer(template: str = "chatml", vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Build a small byte-level BPE tokenizer with a real chat template, offline.

    Args:
        template: ``"chatml"`` (Qwen2.5 style), ``"qwen3"`` (ChatML with ``<think>`` handling)
            or ``"llama3"`` (Llama 3.1 style).
        vocab_size: size of the trained BPE vocabulary: at least 256 (the byte alphabet) and
            at most what the built-in corpus can fill (about 900). The template's special
            tokens are added after it, so ``len(tokenizer)`` is a few IDs larger; size a
            model's embedding table with ``len(tokenizer)``.

    Returns:
        A fresh ``PreTrainedTokenizerFast`` with ``chat_template``, ``eos_token`` and
        ``pad_token`` set (and ``bos_token`` for ``llama3``). Each call returns a new object,
        identical in vocabulary and IDs to every other call with the same arguments.

    Raises:
        ValueError: for an unknown template, or a ``vocab_size`` outside the range above.
    """
    _check_template(template)
    if vocab_size < _BYTE_ALPHABET_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than the {_BYTE_ALPHABET_SIZE}-symbol byte alphabet; "
            f"use {_BYTE_ALPHABET_SIZE} or more"
        )
    backend = Tokenizer.from_str(_trained_tokenizer_json(template, vocab_size))
    role_tokens = _ROLE_TOKENS[template]
    # Every control token is a special token to transformers too (all_special_ids), not only
    # the ones with a role (eos, pad, bos).
    extra_special = [c for c, special in _ADDED_TOKENS[template] if special and c not in role_tokens.values()]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=_CHAT_TEMPLATES[template],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        additional_special_tokens=extra_special,
        **role_tokens,
    )


def turn_end_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Return the IDs of the token(s) that end one turn in a tiny tokenizer's chat template.

    ``<|im_end|>`` for ``chatml`` and ``qwen3``, ``<|eot_id|>`` for ``llama3``. The family is
    recognised from the vocabulary, so this also works on a tokenizer saved with
    :func:`save_tiny_tokenizer` and loaded back with ``AutoTokenizer``.

    Raises:
        ValueError: when the tokenizer is not one of the tiny tokenizers.
    """
    vocab = tokenizer.get_vocab()
    if "<|start_header_id|>" in vocab:
        family = "llama3"
    elif "<|im_start|>" in vocab:
        family = "chatml"
    else:
        raise ValueError(
            "not a tiny tokenizer (neither <|im_start|> nor <|start_header_id|> in its vocabulary); "
            "pass turn-end token IDs explicitly for other tokenizers"
        )
    return [vocab[token] for token in _TURN_END_TOKENS[family]]


def save_tiny_tokenizer(path: str | Path, template: str = "chatml", vocab_size: int = 512) -> Path:
    """Build a tiny tokenizer and save it with ``save_pretrained`` into ``path``.

    The folder loads back with ``transformers.AutoTokenizer.from_pretrained(path)``, which is
    how a model server pointed at a local checkpoint folder finds it. Returns ``path``.
    """
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    build_tiny_tokenizer(template, vocab_size).save_pretrained(str(target))
    return target
