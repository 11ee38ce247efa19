"""local_vllm_model: the version check, the vLLM command line, the config, the splice plumbing.

vLLM needs a GPU machine; the test that starts it skips cleanly without vLLM or a GPU.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest

from nemo_gym.models import vllm_compat
from nemo_gym.testing import SyncClient, running_server
from responses_api_models.local_vllm_model.app import LocalVLLMModel, LocalVLLMModelConfig


@pytest.mark.parametrize("version", ["0.10.2", "0.10.2.post1", "0.11.0", "0.11.2+cu128", "v0.11.1rc2"])
def test_supported_versions_pass(version: str) -> None:
    assert vllm_compat.check_vllm_version(version) == version


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("0.9.2", "cannot return prompt token IDs"),
        ("0.10.1.1", "cannot return"),
        ("0.12.0", "chat preprocessing changed"),
    ],
)
def test_unsupported_versions_fail_with_the_supported_range(version: str, reason: str) -> None:
    with pytest.raises(vllm_compat.UnsupportedVLLMVersion) as raised:
        vllm_compat.check_vllm_version(version)
    message = str(raised.value)
    assert version in message and vllm_compat.SUPPORTED_RANGE in message and reason in message
    assert vllm_compat.check_vllm_version(version, allow_unsupported=True) == version


def test_unreadable_or_missing_vllm_is_a_clear_error() -> None:
    with pytest.raises(vllm_compat.UnsupportedVLLMVersion, match="cannot read the vLLM version"):
        vllm_compat.check_vllm_version("nightly")
    if vllm_compat.installed_vllm_version() is None:
        with pytest.raises(vllm_compat.UnsupportedVLLMVersion, match="vLLM is not installed"):
            vllm_compat.check_vllm_version()


def test_serve_command_carries_the_splice_and_the_flags() -> None:
    config = LocalVLLMModelConfig(
        model="Qwen/Qwen3-8B",
        return_token_id_information=True,
        turn_end_token_ids=[151645],
        vllm_serve_args={"tensor_parallel_size": 2, "enable_prefix_caching": True, "enforce_eager": False},
    )
    command = vllm_compat.vllm_serve_command(
        config.model, host="127.0.0.1", port=8123, serve_args=config.serve_args(), turn_end_token_ids=[151645]
    )
    assert command[1:3] == ["-m", "nemo_gym.models.vllm_compat"]
    separator = command.index("--")
    assert command[3:separator] == ["--splice-model", "Qwen/Qwen3-8B", "--turn-end-token-ids", "151645"]
    vllm_args = command[separator + 1 :]
    assert vllm_args[:6] == ["serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8123"]
    assert (
        "--tensor-parallel-size" in vllm_args
        and vllm_args[vllm_args.index("--tensor-parallel-size") + 1] == "2"
    )
    assert "--enable-prefix-caching" in vllm_args and "--enforce-eager" not in vllm_args
    # Token IDs on: the model's generation_config.json must not inject sampling defaults (top_k).
    assert vllm_args[vllm_args.index("--generation-config") + 1] == "vllm"
    with pytest.raises(ValueError, match="api_server_count"):
        vllm_compat.vllm_serve_command("m", host="h", port=1, serve_args={"api_server_count": 2})


def test_config_refuses_off_policy_settings_and_external_urls() -> None:
    with pytest.raises(ValueError, match=r"override_generation_config\.top_k"):
        LocalVLLMModelConfig(
            model="m",
            return_token_id_information=True,
            vllm_serve_args={"override_generation_config": {"top_k": 20}},
        )
    with pytest.raises(ValueError, match="starts its own vLLM"):
        LocalVLLMModelConfig(model="m", base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="model"):
        LocalVLLMModelConfig.model_validate({})


@pytest.mark.parametrize(
    "shape",
    ["v0.10", "v0.11+"],
)
def test_spliced_ids_replace_every_engine_prompt(shape: str) -> None:
    engine_prompt: dict[str, Any] = {"prompt_token_ids": [1, 2, 3]}
    if shape == "v0.10":
        request_prompt: dict[str, Any] = {"prompt": "text", "prompt_token_ids": [1, 2, 3]}
        preprocessed: tuple[Any, ...] = ([{"role": "user"}], [request_prompt], [engine_prompt])
        expected = 2
    else:
        preprocessed = ([{"role": "user"}], [engine_prompt])
        expected = 1
    assert vllm_compat.replace_prompt_token_ids(preprocessed, [9, 8, 7, 6]) == expected
    assert engine_prompt["prompt_token_ids"] == [9, 8, 7, 6]
    assert preprocessed[0] == [{"role": "user"}]


def test_server_refuses_to_start_without_a_supported_vllm() -> None:
    if vllm_compat.installed_vllm_version() is not None:
        pytest.skip("vLLM is installed here")
    server = LocalVLLMModel({"name": "policy_model", "model": "Qwen/Qwen3-0.6B"})
    with pytest.raises(vllm_compat.UnsupportedVLLMVersion, match="not installed"):
        asyncio.run(server.serve(register=False, embedded=True))


def _gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(
    vllm_compat.installed_vllm_version() is None
    or not _gpu_available()
    or shutil.which("nvidia-smi") is None,
    reason="needs vLLM and a GPU",
)
def test_vllm_serves_responses_with_spliced_token_ids(tmp_path: Any) -> None:  # pragma: no cover - GPU only
    from nemo_gym.engine.tiny_model import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny"))
    server = LocalVLLMModel(
        {
            "name": "policy_model",
            "model": model,
            "return_token_id_information": True,
            "vllm_serve_args": {"max_model_len": 1024, "gpu_memory_utilization": 0.3, "enforce_eager": True},
            "startup_timeout_s": 600,
        }
    )
    with running_server(server) as url, SyncClient(timeout_s=600) as client:
        status, first = client.post(url + "/v1/responses", {"input": "Hello", "max_output_tokens": 8})
        assert status == 200, first
        last = first["output"][-1]
        assert len(last["generation_token_ids"]) == len(last["generation_log_probs"]) > 0
        follow_up = {
            "input": [
                {"role": "user", "content": "Hello"},
                *first["output"],
                {"role": "user", "content": "More"},
            ]
        }
        status, second = client.post(url + "/v1/responses", {**follow_up, "max_output_tokens": 8})
        assert status == 200, second
        prefix = last["prompt_token_ids"] + last["generation_token_ids"]
        assert second["output"][-1]["prompt_token_ids"][: len(prefix) - 1] == prefix[:-1]
