"""Images, files and videos in rollout rows.

- Responses ``input_image`` / ``input_file`` parts and NeMo RL's video parts become vLLM Chat parts
  with their sources unchanged, bounded per prompt (``limit_mm_per_prompt``: a clear 400 past it);
- the token-ID splice stays contiguous when prompts hold image placeholder tokens (the tiny
  ``chatml_vision`` template, built locally, renders Qwen2-VL's ``<|image_pad|>``);
- the CPU engine refuses images with a 400 unless configured with ``vision: true``;
- a collection over image rows (simple_agent → vllm_model → local_hf_model on loopback) keeps the
  image parts and gets contiguous token IDs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.engine.tiny_tokenizer import build_tiny_tokenizer
from nemo_gym.launch.config import project_root
from nemo_gym.models.chat_backend import ChatBridge
from nemo_gym.models.conversion import responses_to_chat_request
from nemo_gym.models.media import MediaLimitError
from nemo_gym.models.token_ids import render_chat_token_ids, spliced_prompt_token_ids
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.serving.server import HTTPError
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import read_jsonl, running_stack, write_jsonl

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def test_media_parts_become_chat_parts_unchanged() -> None:
    params = {
        "input": [
            user(
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": PNG, "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64,JVBERi0=",
                    "filename": "a.pdf",
                },
                {"type": "input_video", "video_url": "file:///data/clip.mp4"},
                {"type": "video_url", "video_url": {"url": "file:///data/b.mp4"}},
                {"type": "video", "video": "file:///data/c.mp4"},
                {"type": "input_video", "url": "file:///data/d.mp4"},
            ),
            {"role": "user", "content": [{"type": "input_text", "text": "plain"}]},
        ]
    }
    messages = responses_to_chat_request(params)["messages"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
        {"type": "video_url", "video_url": {"url": "file:///data/clip.mp4"}},
        {"type": "video_url", "video_url": {"url": "file:///data/b.mp4"}},
        {"type": "video_url", "video_url": {"url": "file:///data/c.mp4"}},
        {"type": "video_url", "video_url": {"url": "file:///data/d.mp4"}},
    ]
    assert messages[1]["content"] == "plain"  # text-only content stays a string
    screenshot = [{"type": "input_text", "text": "clicked"}, {"type": "input_image", "image_url": PNG}]
    tool_turn = {
        "input": [
            {"type": "function_call", "call_id": "c1", "name": "click", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": screenshot},
        ]
    }
    tool_message = responses_to_chat_request(tool_turn)["messages"][1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "clicked"}, {"type": "image_url", "image_url": {"url": PNG}}],
    }

    limited = {
        "input": [
            user({"type": "input_image", "image_url": PNG}),
            user({"type": "input_image", "image_url": PNG}),
        ]
    }
    with pytest.raises(MediaLimitError, match=r"input item 1 content\[0\].*limit_mm_per_prompt.image=1"):
        responses_to_chat_request(limited, limit_mm_per_prompt={"image": 1})
    with pytest.raises(HTTPError) as raised:
        ChatBridge(limit_mm_per_prompt={"image": 1}).chat_request(limited)
    assert raised.value.status_code == 400 and "limit_mm_per_prompt.image=1" in raised.value.message
    with pytest.raises(HTTPError) as raised:  # an image with no source is the request's fault, named
        ChatBridge().chat_request({"input": [user({"type": "input_image", "file_id": "file-1"})]})
    assert raised.value.status_code == 422 and "input item 0 content[0]" in raised.value.message


def test_splice_is_contiguous_across_image_placeholders() -> None:
    tokenizer = build_tiny_tokenizer("chatml_vision")
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    first = [
        user(
            {"type": "text", "text": "What is in the picture?"},
            {"type": "image_url", "image_url": {"url": PNG}},
        )
    ]
    prompt = render_chat_token_ids(first, tokenizer, None, None)
    assert prompt.count(image_pad) == 1
    generation = tokenizer.encode("A cat.", add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    second = [
        *first,
        {
            "role": "assistant",
            "content": "A cat.",
            "prompt_token_ids": prompt,
            "generation_token_ids": generation,
            "generation_log_probs": [-0.1] * len(generation),
        },
        user({"type": "text", "text": "And this one?"}, {"type": "image_url", "image_url": {"url": PNG}}),
    ]
    ids, contiguous = spliced_prompt_token_ids(second, tokenizer)
    assert contiguous and ids[: len(prompt) + len(generation)] == prompt + generation
    assert ids.count(image_pad) == 2  # the new turn's image is rendered after the kept prefix


FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "Cold in Oslo: bring a jacket.",
]


@pytest.mark.slow
def test_collection_over_image_rows_and_the_text_only_engine(tmp_path: Path) -> None:
    engine = {
        "tiny_template": "chatml_vision",
        "served_model_name": "tiny-vision",
        "vision": True,
        "forced_completions": FORCED,
        "default_max_tokens": 48,
    }
    overrides = {
        "local_hf_engine": {"responses_api_models": {"local_hf_model": engine}},
        "policy_model": {"responses_api_models": {"vllm_model": {"model": "tiny-vision", "limit_mm_per_prompt": {"image": 2}}}},
        "text_engine": {
            "responses_api_models": {
                "local_hf_model": {"entrypoint": "app.py", "tiny": True, "torch_num_threads": 1, "default_max_tokens": 8}
            }
        },
    }  # fmt: skip
    (tmp_path / "vision.yaml").write_text(yaml.safe_dump(overrides))
    configs = [
        "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
        "responses_api_models/local_hf_model/configs/local_hf_model.yaml",
        str(tmp_path / "vision.yaml"),
    ]
    image = {"type": "input_image", "image_url": PNG, "detail": "auto"}

    example = read_jsonl(project_root() / "resources_servers/example_single_tool_call/data/example.jsonl")[0]

    def image_row(images: int) -> dict[str, Any]:
        content = [{"type": "input_text", "text": "What is the weather where this photo was taken?"}]
        params = {**example["responses_create_params"], "input": [user(*content, *[image] * images)]}
        return {**example, "responses_create_params": params, "images": images}

    rows = write_jsonl(tmp_path / "in.jsonl", [image_row(1), image_row(2), image_row(3)])
    out = tmp_path / "out.jsonl"

    async def collect(head: dict[str, Any]) -> tuple[Any, int, str]:
        async with RolloutCollectionHelper(rollout_timeout_s=120) as helper:
            summary = await helper.run_from_config(
                {
                    "input_jsonl_fpath": str(rows),
                    "output_jsonl_fpath": str(out),
                    "agent_name": "example_single_tool_call_simple_agent",
                    "num_samples_in_parallel": 1,
                    "head_server": head,
                    "disable_aggregation": True,
                }
            )
        client = ServerClient(f"http://{head['host']}:{head['port']}")
        try:
            answer = await client.post(
                "text_engine",
                "/v1/chat/completions",
                {"messages": [user({"type": "image_url", "image_url": {"url": PNG}})]},
            )
        finally:
            await client.close()
        return summary, answer.status, answer.body.decode()

    with running_stack(configs) as handle:
        summary, status, body = asyncio.run(collect(handle.head_server_config))

    assert status == 400 and "text-only model" in body and "vision: true" in body
    assert (summary.succeeded, summary.failed) == (2, 1)
    (failure,) = read_jsonl(out.with_name("out_failures.jsonl"))
    assert failure["images"] == 3 and "limit_mm_per_prompt.image=2" in failure["_ng_error"]
    tokenizer = build_tiny_tokenizer("chatml_vision")
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for result in read_jsonl(out):
        (message,) = result["responses_create_params"]["input"]
        assert message["content"][1:] == [image] * result["images"]  # the parts, unchanged
        calls = [item for item in result["response"]["output"] if "generation_token_ids" in item]
        assert len(calls) == 2 and result["reward"] == 1.0
        assert calls[0]["prompt_token_ids"].count(image_pad) == result["images"]
        prefix = calls[0]["prompt_token_ids"] + calls[0]["generation_token_ids"]
        assert calls[1]["prompt_token_ids"][: len(prefix)] == prefix
        assert "token_ids_contiguous" not in calls[1]
