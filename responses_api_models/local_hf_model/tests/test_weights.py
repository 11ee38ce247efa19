"""POST /update_weights_from_disk: a trainer's updated policy becomes the engine's, all or nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from nemo_gym.engine.tiny_model import build_tiny_model
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_hf_model.app import LocalHFModel

PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with running_server(LocalHFModel({"name": "engine", "tiny": True, "weight_updates": True})) as url:
        yield url


def scores(client: SyncClient, url: str) -> list[float]:
    """The served model's logprob of each prompt token (vLLM's scoring form)."""
    status, body = client.post(
        url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0}
    )
    assert status == 200, body
    return [float(next(iter(e.values()))["logprob"]) for e in body["choices"][0]["prompt_logprobs"][1:]]


def reference(model: Any) -> list[float]:
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    return [float(logprobs[i - 1, t]) for i, t in enumerate(PROMPT) if i > 0]


def test_new_weights_are_served_after_the_update(engine: str, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5, alpha=1.0)
    model.save_pretrained(tmp_path / "step1", safe_serialization=True)
    with SyncClient() as client:
        before = scores(client, engine)
        status, body = client.post(
            engine + "/update_weights_from_disk", {"model_path": str(tmp_path / "step1")}
        )
        assert status == 200 and body["success"] is True and body["weights_version"] >= 1, body
        after = scores(client, engine)
    assert after != pytest.approx(before, abs=1e-3)
    assert after == pytest.approx(reference(model.eval()), abs=1e-4)


def test_a_bad_checkpoint_changes_nothing_and_names_what_is_wrong(engine: str, tmp_path: Path) -> None:
    good = build_tiny_model()
    tensors = load_file(str(good / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("mlp.up_proj.weight"))
    with SyncClient() as client:
        before = scores(client, engine)
        for case, changed, expected in [
            ("shape", {**tensors, name: torch.zeros(3, 3)}, f"tensor '{name}' has shape (3, 3)"),
            ("unknown", {**tensors, "extra.weight": torch.zeros(1)}, "extra.weight"),
            ("missing", {k: v for k, v in tensors.items() if k != name}, name),
        ]:
            folder = tmp_path / case
            folder.mkdir()
            # One good tensor changed first, so a partial load would show in the scores.
            changed = {
                **changed,
                **{k: v + 1.0 for k, v in changed.items() if k.endswith("embed_tokens.weight")},
            }
            save_file(changed, str(folder / "model.safetensors"))
            status, body = client.post(engine + "/update_weights_from_disk", {"model_path": str(folder)})
            assert status == 400 and expected in body["error"]["message"], (case, body)
        assert scores(client, engine) == pytest.approx(before, abs=1e-6)
        status, body = client.post(
            engine + "/update_weights_from_disk", {"model_path": str(tmp_path / "nope")}
        )
        assert status == 400 and "is not a folder" in body["error"]["message"]
        (tmp_path / "empty").mkdir()
        status, body = client.post(
            engine + "/update_weights_from_disk", {"model_path": str(tmp_path / "empty")}
        )
        assert status == 400 and "safetensors" in body["error"]["message"]
        status, body = client.post(engine + "/update_weights_from_disk", {})
        assert status == 400 and "model_path" in body["error"]["message"]


def test_weight_updates_are_off_unless_configured() -> None:
    with running_server(LocalHFModel({"name": "fixed", "tiny": True})) as url, SyncClient() as client:
        status, body = client.post(url + "/update_weights_from_disk", {"model_path": "/tmp"})
    assert status == 403 and "weight_updates: true" in body["error"]["message"]
