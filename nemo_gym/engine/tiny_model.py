"""A tiny random-weights causal LM, built offline, for the CPU engine and tests.

:func:`build_tiny_model` writes a Hugging Face checkpoint folder (config, safetensors weights,
tokenizer from :mod:`nemo_gym.engine.tiny_tokenizer`, generation config) that loads with
``AutoModelForCausalLM.from_pretrained(path)`` and ``AutoTokenizer.from_pretrained(path)``
without any network access. The model is a 2-layer Qwen2 (``chatml``, ``qwen3`` templates) or
Llama (``llama3`` template) with a hidden size of 64 and the tokenizer's vocabulary.

Its weights are random but deterministic for a given ``seed``, and initialised wider than
usual (``initializer_range=0.3``) so that next-token distributions are far from uniform: a test
that compares log-probabilities then notices a wrong token or an off-by-one position.

Builds are cached by content: a folder whose marker file records the same build key (template,
seed, architecture, transformers version) is reused as is, so repeated builds cost a file read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Final

__all__ = ["TINY_MODEL_ARCHITECTURE", "build_tiny_model", "default_tiny_model_path", "tiny_model_key"]

MARKER_FILE: Final = "nemo_gym_tiny_model.json"

# Small enough that a forward pass over a few hundred tokens takes milliseconds on one core.
TINY_MODEL_ARCHITECTURE: Final[dict[str, Any]] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "initializer_range": 0.3,
    "rms_norm_eps": 1e-6,
}


def tiny_model_key(template: str = "chatml", seed: int = 0) -> str:
    """The content key of a build: equal keys mean identical folders (hex sha256)."""
    import transformers

    from nemo_gym.engine import tiny_tokenizer

    # The tokenizer's own JSON is part of the key, so a change to its corpus or templates
    # invalidates cached models whose vocabulary no longer matches.
    tokenizer = tiny_tokenizer.build_tiny_tokenizer(template)
    payload = {
        "template": template,
        "seed": seed,
        "architecture": TINY_MODEL_ARCHITECTURE,
        "transformers": transformers.__version__,
        "tokenizer": hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest(),
        "chat_template": hashlib.sha256(str(tokenizer.chat_template).encode()).hexdigest(),
        "format": 1,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def default_tiny_model_path(template: str = "chatml", seed: int = 0) -> Path:
    """Where :func:`build_tiny_model` puts a build when no path is given.

    ``$NEMO_GYM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/nemo_gym`` (``~/.cache/nemo_gym``),
    under ``tiny_models/<template>-seed<seed>-<key prefix>``.
    """
    root = os.environ.get("NEMO_GYM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "nemo_gym"
    )
    key = tiny_model_key(template, seed)
    return Path(root) / "tiny_models" / f"{template}-seed{seed}-{key[:16]}"


def _read_marker(path: Path) -> str | None:
    try:
        return json.loads((path / MARKER_FILE).read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_model(target: Path, template: str, seed: int, key: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from nemo_gym.engine import tiny_tokenizer

    tokenizer = tiny_tokenizer.build_tiny_tokenizer(template)
    turn_end = tiny_tokenizer.turn_end_token_ids(tokenizer)
    common = dict(
        TINY_MODEL_ARCHITECTURE,
        vocab_size=len(tokenizer),
        eos_token_id=turn_end[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    if template == "llama3":
        config: Any = LlamaConfig(**common, bos_token_id=tokenizer.bos_token_id)
        model_class: Any = LlamaForCausalLM
    else:
        config = Qwen2Config(**common)
        model_class = Qwen2ForCausalLM
    # fork_rng keeps the caller's global RNG untouched by this build.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=turn_end, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    marker = {"key": key, "template": template, "seed": seed, "built_by": "nemo_gym.engine.tiny_model"}
    (target / MARKER_FILE).write_text(json.dumps(marker, indent=2))


def build_tiny_model(
    path: str | os.PathLike[str] | None = None, template: str = "chatml", seed: int = 0
) -> Path:
    """Write a tiny random-weights causal LM with the tiny tokenizer into ``path``; return the path.

    Args:
        path: the checkpoint folder to write; ``None`` uses :func:`default_tiny_model_path`.
            An existing folder is reused when its marker records the same build, and replaced
            otherwise (only folders this function built, or empty ones, are replaced).
        template: the chat template family of the tokenizer: ``chatml``, ``qwen3`` or ``llama3``.
        seed: the weight-initialisation seed.

    Returns:
        The folder, loadable offline with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.

    Raises:
        ValueError: for an unknown template, or when ``path`` is a non-empty folder that this
            function did not build (it refuses to delete someone else's files).
    """
    from nemo_gym.engine import tiny_tokenizer

    if template not in tiny_tokenizer.TEMPLATES:
        raise ValueError(
            f"unknown tiny model template {template!r}; choose one of {', '.join(tiny_tokenizer.TEMPLATES)}"
        )
    key = tiny_model_key(template, seed)
    target = Path(path) if path is not None else default_tiny_model_path(template, seed)
    if _read_marker(target) == key:
        return target
    if target.exists() and any(target.iterdir()) and _read_marker(target) is None:
        raise ValueError(
            f"{target} is a non-empty folder that build_tiny_model did not write; give an empty or new path"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename into place, so that concurrent builders (two engine
    # processes starting together) never see a half-written folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write_model(staging, template, seed, key)
        if _read_marker(target) == key:
            return target
        if target.exists():
            stale = target.parent / f".{target.name}.stale-{uuid.uuid4().hex}"
            try:
                os.rename(target, stale)
            except OSError:
                pass
            else:
                shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            # Another builder won the race; its folder is just as good if its key matches.
            if _read_marker(target) != key:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
