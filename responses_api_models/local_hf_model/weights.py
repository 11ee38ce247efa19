"""New weights for a running engine, from a checkpoint folder on disk (SGLang's
``/update_weights_from_disk``): how a trainer on the same machine hands the policy it just updated
to the engine that generates its next rollouts.

Only ``*.safetensors`` files are read (no pickle: loading runs no code from the folder), every
tensor must match a parameter of the served model by name and shape, and nothing is changed
unless all of them do. Runs on the engine's generation thread, so no generation sees half a
model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class WeightsError(ValueError):
    """The folder cannot become the served model's weights; the message names what is wrong."""


def read_checkpoint_tensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``folder`` (a ``save_pretrained`` folder)."""
    from safetensors.torch import load_file

    path = Path(folder)
    if not path.is_dir():
        raise WeightsError(f"model_path {folder!r} is not a folder (give the folder save_pretrained wrote)")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(
            f"model_path {folder!r} holds no *.safetensors file (save with save_pretrained(safe_serialization=True))"
        )
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def load_weights(model: Any, tensors: dict[str, torch.Tensor]) -> int:
    """Copy ``tensors`` into ``model``'s parameters in place; the number of tensors copied.

    All-or-nothing: an unknown name, a missing parameter or a shape that differs raises
    :class:`WeightsError` before anything is copied. Tied parameters (an output layer sharing
    the embedding) may be absent from the checkpoint, as ``save_pretrained`` leaves them out.
    """
    state = model.state_dict()
    unknown = sorted(set(tensors) - set(state))
    if unknown:
        raise WeightsError(f"the checkpoint has tensors the served model does not: {unknown[:5]}")
    tied = {name for name in state if _is_tied(model, name)}
    missing = sorted(set(state) - set(tensors) - tied)
    if missing:
        raise WeightsError(f"the checkpoint lacks tensors of the served model: {missing[:5]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise WeightsError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}; the served model's is {tuple(state[name].shape)}"
            )
    with torch.no_grad():
        for name, tensor in tensors.items():
            state[name].copy_(tensor.to(dtype=state[name].dtype))
    return len(tensors)


def _is_tied(model: Any, name: str) -> bool:
    """Whether ``name`` is the output embedding tied to the input embedding (saved once)."""
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return False
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return output is not None and name.startswith("lm_head.")
