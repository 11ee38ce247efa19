"""nemo_gym.token_id_capture in pieces: store, lineage, capture context, builder, staging, middleware.

Real files (the store and the file ledger in a temporary directory), a real ASGI app behind the
capture middleware; the end-to-end run through ``ng_run`` is tests/test_token_id_capture_stack.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from nemo_gym.token_id_capture import (
    FileLineageStore,
    InMemoryLineageStore,
    ParentResolutionStatus,
    TokenCaptureStore,
    TokenEntry,
    assistant_fingerprint,
    compute_digest,
    current_capture_context,
    prefix_merging,
    stamp_continuation,
    stamp_lineage,
    token_id_capture_config,
    trajectories_from_source,
)
from nemo_gym.token_id_capture.conformance import ConformanceError, run_conformance
from nemo_gym.token_id_capture.middleware import TokenCaptureMiddleware
from nemo_gym.token_id_capture.request_items import request_messages
from nemo_gym.token_id_capture.sink import capture_tokens, resolve_parent
from nemo_gym.token_id_capture.staging import (
    CaptureAdmission,
    ReceiptVerificationError,
    RolloutReceipt,
    RolloutTokenCapture,
    StagedCallBaseSnapshot,
    StageResult,
    select_terminal_call,
    verify_and_linearize,
)
from nemo_gym.token_id_capture.staging.records import CallRecord

USER = {"role": "user", "content": "weather in Oslo?"}


def _entry(
    call_id: str,
    prompt: list[int],
    generation: list[int],
    request: list[dict],
    text: str,
    parent: TokenEntry | None = None,
) -> TokenEntry:
    entry = TokenEntry(
        rollout_id="r",
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-0.5] * len(generation),
        output_items=[
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ],
        token_item_index=0,
    )
    stamp_continuation(entry, request)
    status = ParentResolutionStatus.RESOLVED if parent else ParentResolutionStatus.ROOT
    return stamp_lineage(entry, parent.model_call_id if parent else None, parent_resolution=status)


def test_fingerprints_agree_across_dialects_and_ignore_token_fields() -> None:
    chat = [
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
            ],
        },
    ]
    responses = [
        USER,
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "f",
            "arguments": '{"a":2,"b":1}',
            "prompt_token_ids": [1],
        },
    ]
    anthropic = [
        USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 2, "b": 1}}],
        },
    ]
    assert (
        assistant_fingerprint(chat)
        == assistant_fingerprint(responses)
        == assistant_fingerprint(anthropic)
        != ""
    )
    assert assistant_fingerprint([USER]) == ""
    with pytest.raises(ValueError, match="cannot be fingerprinted"):
        assistant_fingerprint([USER, "not an object"])  # type: ignore[list-item]


def test_store_is_durable_idempotent_fenced_and_retires_only_the_snapshot_consumed(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    first = _entry("c1", [1, 2], [3], [USER], "a")
    asyncio.run(store.put(first))
    asyncio.run(store.put(TokenEntry.model_validate(first.model_dump(mode="json"))))  # a retry: no-op
    with pytest.raises(ValueError, match="reused with a different payload"):
        asyncio.run(store.put(_entry("c1", [1, 2], [4], [USER], "b")))
    snapshot = store.freeze_now("r")
    assert [e.model_call_id for e in snapshot.entries] == [
        "c1"
    ] and snapshot.incomplete  # the conflict masks it
    assert store.freeze_now("r").snapshot_id == snapshot.snapshot_id
    with pytest.raises(RuntimeError, match="already frozen"):
        asyncio.run(store.put(_entry("c2", [1, 2, 3, 5], [6], [USER], "c")))
    assert not asyncio.run(store.drop("r", snapshot_id=snapshot.snapshot_id, version=snapshot.version + 1))
    assert asyncio.run(store.drop("r", snapshot_id=snapshot.snapshot_id, version=snapshot.version))
    assert not store.path_for("r").exists()
    with pytest.raises(ValueError, match="invalid rollout id"):
        store.path_for("../escape")


def test_a_torn_last_line_is_cut_and_the_rest_recovered(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    asyncio.run(store.put(_entry("c1", [1, 2], [3], [USER], "a")))
    store.state_path_for("r").unlink()  # the writer stopped before its state write
    with store.path_for("r").open("ab") as handle:
        handle.write(b'{"rollout_id": "r", "model_ca')
    snapshot = store.freeze_now("r")
    assert [e.model_call_id for e in snapshot.entries] == ["c1"]


def test_lineage_resolves_only_a_faithful_continuation(tmp_path: Path) -> None:
    store, lineage = TokenCaptureStore(tmp_path), FileLineageStore(tmp_path)
    first = _entry("c1", [1, 2], [3, 4], [USER], "sunny")
    asyncio.run(store.put(first))
    follow = [USER, *first.output_items, {"role": "user", "content": "and tomorrow?"}]
    resolution = asyncio.run(lineage.resolve("r", follow))
    assert resolution.status == ParentResolutionStatus.RESOLVED
    assert resolution.match is not None and list(resolution.match.cumulative_token_ids) == [1, 2, 3, 4]
    summarized = [{"role": "user", "content": "(summary)"}, *first.output_items]
    assert asyncio.run(lineage.resolve("r", summarized)).status == ParentResolutionStatus.UNRESOLVED
    assert asyncio.run(lineage.resolve("r", [USER])).status == ParentResolutionStatus.ROOT
    # Two calls with the same output but different tokens: never a guess.
    asyncio.run(store.put(_entry("c9", [1, 7], [3, 4], [USER], "sunny")))
    ambiguous = asyncio.run(FileLineageStore(tmp_path).resolve("r", follow))
    assert ambiguous.status == ParentResolutionStatus.UNRESOLVED and ambiguous.reason == "ambiguous"


def test_builder_joins_verified_links_and_masks_what_it_cannot_prove() -> None:
    root = _entry("c1", [1, 2], [3], [USER], "a")
    child = _entry("c2", [1, 2, 3, 9], [4, 5], [USER], "b", parent=root)
    out = prefix_merging([child, root])
    (chain,) = out.chains
    assert chain.chain_id == "main" and [link.entry.model_call_id for link in chain.links] == ["c1", "c2"]
    assert chain.links[1].interstitial == [9] and out.notes.delivered_fraction == 1.0
    # A child whose prompt does not begin with its parent's tokens is cut off from it.
    liar = _entry("c3", [1, 2, 8, 9], [4], [USER], "c", parent=root)
    out = prefix_merging([root, liar])
    assert out.notes.parent_link_failures == {"parent_digest_mismatch": 1} and out.notes.roots == 2


def test_consumer_reads_a_capture_back_as_one_contiguous_sequence(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    root = _entry("c1", [1, 2], [3], [USER], "a")
    asyncio.run(store.put(root))
    asyncio.run(store.put(_entry("c2", [1, 2, 3, 9], [4, 5], [USER], "b", parent=root)))
    built = asyncio.run(trajectories_from_source("r", store))
    assert built is not None and built["mask_sample"] is False
    tokens = [(i["prompt_token_ids"], i["generation_token_ids"]) for i in built["rebuilt_response"]["output"]]
    assert tokens == [([1, 2], [3]), ([1, 2, 3, 9], [4, 5])]
    asyncio.run(store.mark_incomplete("r", "c3"))  # a lost call after freeze still masks the sample
    assert asyncio.run(trajectories_from_source("r", TokenCaptureStore(tmp_path)))["mask_sample"] is True


def test_the_file_store_passes_the_conformance_suite_and_a_lossy_transport_fails_it(tmp_path: Path) -> None:
    passed = asyncio.run(
        run_conformance(
            lambda: TokenCaptureStore(tmp_path),
            lambda: TokenCaptureStore(tmp_path),
            lambda: FileLineageStore(tmp_path),
        )
    )
    assert "fresh_client_lineage_visibility" in passed and "begin_call_custody" in passed

    class ForgetfulSink:  # drops the incomplete marker: the silent-loss case
        def __init__(self) -> None:
            self.store = TokenCaptureStore(tmp_path / "forgetful")

        async def put(self, entry: TokenEntry) -> None:
            await self.store.put(entry)

        async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
            return None

        async def close(self) -> None:
            return None

    with pytest.raises(ConformanceError) as failure:
        asyncio.run(run_conformance(ForgetfulSink, lambda: TokenCaptureStore(tmp_path / "forgetful")))
    assert failure.value.check_name == "mark_incomplete_durability"


def test_capture_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        token_id_capture_config({"token_id_capture": {"enabled": True, "dir": "relative"}})
    with pytest.raises(ValueError, match="lineage_store"):
        token_id_capture_config(
            {
                "token_id_capture": {
                    "enabled": True,
                    "sink": "nemo_gym.token_id_capture.store:TokenCaptureStore",
                }
            }
        )
    with pytest.raises(ValueError, match="rebuild_response=false"):
        token_id_capture_config({"token_id_capture": {"enabled": True, "external_staging": True}})
    config = token_id_capture_config(
        {
            "token_id_capture": {
                "enabled": True,
                "sink": "nemo_gym.token_id_capture.lineage:InMemoryLineageStore",
                "allow_unresolved_continuations": True,
            }
        }
    )
    with pytest.raises(ValueError, match="is not a TokenSink: it lacks mark_incomplete"):
        config.build_sink()


def _model_app(answers: list[dict[str, Any]]) -> Starlette:
    """A model server whose handler resolves, answers with token IDs, and captures (as the base does)."""

    async def responses(request: Request) -> JSONResponse:
        body = await request.json()
        messages = request_messages(body)
        await resolve_parent(messages)
        answer = answers.pop(0)
        await capture_tokens(answer, request_messages=messages)
        return JSONResponse(answer)

    async def metadata(request: Request) -> JSONResponse:
        assert current_capture_context() is None
        return JSONResponse({"weights": 7})

    return Starlette(
        routes=[Route("/v1/responses", responses, methods=["POST"]), Route("/metadata", metadata)]
    )


def _answer(text: str, prompt: list[int], generation: list[int]) -> dict[str, Any]:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {
        "id": f"resp-{text}",
        "output": [
            {
                **item,
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [-1.0] * len(generation),
            }
        ],
    }


def test_middleware_captures_a_two_turn_rollout_and_flags_unclassified_routes(tmp_path: Path) -> None:
    store = TokenCaptureStore(tmp_path)
    app = TokenCaptureMiddleware(
        _model_app([_answer("one", [1, 2], [3]), _answer("two", [1, 2, 3, 4], [5]), _answer("3", [1], [2])]),
        store=None, token_store=store, lineage_store=FileLineageStore(tmp_path), token_capture_enabled=True,
    )  # fmt: skip
    prefix = "/ng-rollout/r7/training-token-capture"
    with TestClient(app) as client:
        first = client.post(f"{prefix}/v1/responses", json={"input": [USER]}).json()
        echoed = [USER, *first["output"], {"role": "user", "content": "more"}]
        client.post(f"{prefix}/v1/responses", json={"input": echoed})
        # Without the capture segment the call is served, not captured.
        assert client.post("/ng-rollout/r8/v1/responses", json={"input": [USER]}).status_code == 200
    entries = sorted(store.read_entries("r7"), key=lambda e: len(e.prompt_token_ids))
    assert [e.parent_resolution for e in entries] == [
        ParentResolutionStatus.ROOT,
        ParentResolutionStatus.RESOLVED,
    ]
    assert entries[1].parent_call_id == entries[0].model_call_id and entries[1].digest == compute_digest(
        [1, 2, 3, 4, 5]
    )
    assert not store.freeze_now("r7").incomplete and store.read_entries("r8") == []
    with TestClient(app) as client:
        assert client.get("/ng-rollout/r9/training-token-capture/metadata").json() == {"weights": 7}
    assert store.is_incomplete("r9")  # an unclassified route's answer may carry generated text
    with TestClient(app) as client:  # a HEAD (Claude Code's probe of its base URL) carries none
        assert client.head("/ng-rollout/r11/training-token-capture/metadata").status_code == 200
    assert not store.is_incomplete("r11")
    declared = TokenCaptureMiddleware(
        _model_app([]), store=None, token_store=store, non_generating_requests={("GET", "/metadata")}
    )
    with TestClient(declared) as client:
        client.get("/ng-rollout/r10/training-token-capture/metadata")
    assert not store.is_incomplete("r10")


class _Staging:
    def __init__(self) -> None:
        self.records: dict[str, Any] = {}

    def stage(self, record: Any, *, attachments: Any = None) -> StageResult:
        self.records[record.staging_key] = record
        return StageResult(ok=True, staging_key=record.staging_key)


def test_worker_staging_verifies_and_linearizes_and_refuses_a_tampered_delta() -> None:
    sink = _Staging()
    capture = RolloutTokenCapture(sink=sink, weight_version_fn=lambda: 3)
    root = CaptureAdmission(rollout_id="r", model_call_id="a", mode="text")
    a = capture.complete_call(
        capture.begin_call(root), prompt_token_ids=[10], generated_token_ids=[11], generated_logprobs=[-0.5]
    )
    child = CaptureAdmission(
        rollout_id="r",
        model_call_id="b",
        mode="token_in",
        parent_call_id="a",
        prev_len=2,
        staging_chain=[a.staging_key],
        parent_chain_hash=a.chain_hash,
    )
    b = capture.complete_call(
        capture.begin_call(child, prefix_token_ids=[10, 11]),
        prompt_token_ids=[10, 11, 20],
        generated_token_ids=[21],
        generated_logprobs=[-0.25],
    )
    manifest = [
        CallRecord(**c.model_dump(exclude={"rollout_id", "disposition", "schema_version"}), mode=m, response_id=f"resp-{c.model_call_id}")
        for c, m in ((a, "text"), (b, "token_in"))
    ]  # fmt: skip
    receipt = RolloutReceipt(
        rollout_id="r", manifest=manifest, terminal_model_call_id="b", terminal_selection="declared"
    )
    snapshots = [
        StagedCallBaseSnapshot.model_validate(sink.records[r.staging_key].model_dump(exclude={"extras"}))
        for r in manifest
    ]
    row = verify_and_linearize(receipt, snapshots)
    assert (row.token_ids, row.token_mask, row.logprobs) == (
        [10, 11, 20, 21],
        [0.0, 1.0, 0.0, 1.0],
        [0.0, -0.5, 0.0, -0.25],
    )
    assert select_terminal_call(manifest).terminal_model_call_id == "b"
    forged = snapshots[1].model_dump()
    forged["token_ids_delta"] = [20, 22]
    with pytest.raises(ValueError, match="digest does not match"):
        StagedCallBaseSnapshot.model_validate(forged)
    with pytest.raises(ReceiptVerificationError, match="row_count_mismatch"):
        verify_and_linearize(receipt, snapshots[:1])
    # A generation whose prompt does not begin with the admitted prefix is never staged.
    bad = capture.begin_call(child.model_copy(update={"model_call_id": "c"}), prefix_token_ids=[10, 11])
    failed = capture.complete_call(
        bad, prompt_token_ids=[10, 99, 20], generated_token_ids=[21], generated_logprobs=[-0.1]
    )
    assert failed.disposition == "capture_failed" and "r/c" not in sink.records


def test_in_memory_ledger_admits_children_of_recorded_calls_only() -> None:
    ledger = InMemoryLineageStore()
    assert asyncio.run(ledger.manifest("r")) == {
        "rollout_id": "r",
        "records": [],
        "failures": [],
        "schema_version": 2,
    }
    asyncio.run(ledger.record_failure("r", "x", "unresolved_parent"))
    assert asyncio.run(ledger.has_rows("r"))


TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import json
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_calls_in_the_anthropic_and_gemini_dialects_are_captured_and_chained(tmp_path: Path) -> None:
    """Claude Code's and Gemini CLI's dialects on the CPU engine: a tool round, echoed without token
    IDs, is captured as a root and its verified child, and reads back as one contiguous sequence."""
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient
    from nemo_gym.testing import running_server
    from responses_api_models.local_hf_model.app import LocalHFModel

    captures = tmp_path / "captures"
    client = NeMoGymServerClient(
        global_config_dict={"token_id_capture": {"enabled": True, "dir": str(captures)}}
    )
    engine = LocalHFModel(
        {"name": "engine", "tiny": True, "default_max_tokens": 48, "return_token_id_information": True,
         "forced_completions": [TOOL_CALL, "It is sunny in Oslo.", TOOL_CALL, "Sunny."]},
        client,
    )  # fmt: skip
    with running_server(engine) as url:
        prefix = f"{url}/ng-rollout/claude/training-token-capture"
        asked = [{"role": "user", "content": "weather in Oslo?"}]
        tools = [{"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER}]
        first = _post(
            f"{prefix}/v1/messages",
            {"model": "claude-x", "max_tokens": 48, "messages": asked, "tools": tools},
        )
        use = next(block for block in first["content"] if block["type"] == "tool_use")
        echoed = [
            *asked,
            {"role": "assistant", "content": first["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"}],
            },
        ]
        _post(
            f"{prefix}/v1/messages",
            {"model": "claude-x", "max_tokens": 48, "messages": echoed, "tools": tools},
        )

        gemini = f"{url}/ng-rollout/gemini/training-token-capture/v1beta/models/gemini-x:generateContent"
        declarations = [{"functionDeclarations": [{"name": "get_weather", "parameters": WEATHER}]}]
        contents = [{"role": "user", "parts": [{"text": "weather in Oslo?"}]}]
        answer = _post(gemini, {"contents": contents, "tools": declarations})
        call = next(
            p["functionCall"] for p in answer["candidates"][0]["content"]["parts"] if "functionCall" in p
        )
        contents += [
            answer["candidates"][0]["content"],
            {"role": "user", "parts": [{"functionResponse": {"id": call.get("id"), "name": call["name"], "response": {"output": "sunny"}}}]},
        ]  # fmt: skip
        _post(gemini, {"contents": contents, "tools": declarations})

    for rollout_id in ("claude", "gemini"):
        entries = sorted(
            TokenCaptureStore(captures).read_entries(rollout_id), key=lambda e: len(e.prompt_token_ids)
        )
        assert [e.parent_resolution for e in entries] == [
            ParentResolutionStatus.ROOT,
            ParentResolutionStatus.RESOLVED,
        ]
        built = asyncio.run(trajectories_from_source(rollout_id, TokenCaptureStore(captures)))
        assert built is not None and built["mask_sample"] is False, (rollout_id, built)
        assert built["metrics"]["chains"] == 1 and built["metrics"]["delivered_fraction"] == 1.0


def _stream(url: str, body: dict[str, Any]) -> bytes:
    import json
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return answer.read()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_answers_streamed_as_the_engine_produces_them_are_captured(tmp_path: Path) -> None:
    """vllm_model streams Responses and Chat events as the engine's chunks arrive (Codex and
    OpenCode always stream): the middleware captures the whole answer before the stream ends."""
    from nemo_gym.models.call_capture import reconstruct_streamed_response
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient
    from nemo_gym.testing import running_server
    from responses_api_models.local_hf_model.app import LocalHFModel
    from responses_api_models.vllm_model.app import VLLMModel

    captures = tmp_path / "captures"
    client = NeMoGymServerClient(
        global_config_dict={"token_id_capture": {"enabled": True, "dir": str(captures)}}
    )
    engine = LocalHFModel(
        {"name": "engine", "tiny": True, "default_max_tokens": 48, "return_token_id_information": True,
         "forced_completions": [TOOL_CALL, "Sunny.", "Hello."]}
    )  # fmt: skip
    with running_server(engine) as engine_url:
        policy = VLLMModel(
            {"name": "policy", "base_url": engine_url + "/v1", "model": "tiny-chatml", "return_token_id_information": True},
            client,
        )  # fmt: skip
        with running_server(policy) as url:
            prefix = f"{url}/ng-rollout/codex/training-token-capture/v1"
            tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
            asked = [{"role": "user", "content": "weather in Oslo?"}]
            first = reconstruct_streamed_response(
                _stream(f"{prefix}/responses", {"input": asked, "tools": tools}), "responses"
            )
            assert first is not None
            call = next(item for item in first["output"] if item["type"] == "function_call")
            echoed = [
                *asked,
                *first["output"],
                {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
            ]
            _stream(f"{prefix}/responses", {"input": echoed, "tools": tools})
            chat = f"{url}/ng-rollout/opencode/training-token-capture/v1/chat/completions"
            _stream(chat, {"model": "tiny-chatml", "messages": [{"role": "user", "content": "hi"}]})

    store = TokenCaptureStore(captures)
    codex = sorted(store.read_entries("codex"), key=lambda e: len(e.prompt_token_ids))
    assert [e.parent_resolution for e in codex] == [
        ParentResolutionStatus.ROOT,
        ParentResolutionStatus.RESOLVED,
    ]
    built = asyncio.run(trajectories_from_source("codex", store))
    assert built is not None and built["mask_sample"] is False, built
    (opencode,) = TokenCaptureStore(captures).read_entries("opencode")
    assert opencode.generation_token_ids and len(opencode.generation_log_probs) == len(
        opencode.generation_token_ids
    )
    assert not TokenCaptureStore(captures).is_incomplete("opencode")


def test_the_finalizer_rebuilds_a_record_without_token_ids_and_retires_only_after_hand_off(
    tmp_path: Path,
) -> None:
    from nemo_gym.token_id_capture.delivery import (
        finalize_rollout_token_capture,
        retire_rollout_token_capture,
    )

    store = TokenCaptureStore(tmp_path)
    root = _entry("c1", [1, 2], [3], [USER], "a").model_copy(update={"rollout_id": "4-2"})
    child = _entry("c2", [1, 2, 3, 9], [4, 5], [USER], "b", parent=root).model_copy(
        update={"rollout_id": "4-2"}
    )
    for entry in (root, child):
        asyncio.run(store.put(entry))
    record = {"_ng_task_index": 4, "_ng_rollout_index": 2, "reward": 1.0, "response": {"id": "x", "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}]}}  # fmt: skip
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and not built["mask_sample"] and record["reward"] == 1.0
    assert [i["generation_token_ids"] for i in record["response"]["output"]] == [[3], [4, 5]]
    assert asyncio.run(retire_rollout_token_capture("4-2", store, built))
    # Nothing captured for a record that needed it: masked, with the reason.
    lost = {"_ng_task_index": 5, "_ng_rollout_index": 0, "reward": 1.0, "response": {"output": []}}
    with pytest.warns(UserWarning):
        asyncio.run(finalize_rollout_token_capture(lost, store))
    assert lost["mask_sample"] is True and lost["_ng_token_capture"]["error"]
    # A record that carries its own token IDs keeps them.
    own = {"_ng_task_index": 6, "_ng_rollout_index": 0, "response": {"output": [{"generation_token_ids": [7], "prompt_token_ids": [1], "generation_log_probs": [-1.0]}]}}  # fmt: skip
    kept = asyncio.run(finalize_rollout_token_capture(own, store))
    assert (
        kept is not None
        and kept["_redundant_capture"]
        and own["response"]["output"][0]["generation_token_ids"] == [7]
    )


def test_a_nemo_gym_style_adapter_served_here_captures_behind_the_stripped_prefix(tmp_path: Path) -> None:
    """A FastAPI adapter written NeMo Gym's way, served by our server (which strips the rollout
    prefix before the adapter's own app sees the path): its calls are captured all the same."""
    from fastapi import Request as FastAPIRequest

    from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel
    from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
    from nemo_gym.serving.nemo_gym_client import NeMoGymServerClient
    from nemo_gym.testing import running_server

    class TokenAdapter(SimpleResponsesAPIModel):
        async def responses(
            self, request: FastAPIRequest, body: NeMoGymResponseCreateParamsNonStreaming
        ) -> NeMoGymResponse:
            turn = sum(1 for item in body.input if isinstance(item, dict) and item.get("role") == "assistant")
            prompt = [1, 2] if turn == 0 else [1, 2, 3, 4]
            item = {"id": f"m{turn}", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": f"turn {turn}", "annotations": []}],
                    "prompt_token_ids": prompt, "generation_token_ids": [3 + 2 * turn], "generation_log_probs": [-0.5]}  # fmt: skip
            return NeMoGymResponse.model_validate(
                {
                    "id": f"resp-{turn}",
                    "created_at": 0,
                    "model": "m",
                    "object": "response",
                    "output": [item],
                    "parallel_tool_calls": True,
                    "tool_choice": "auto",
                    "tools": [],
                }  # fmt: skip
            )

    captures = tmp_path / "captures"
    client = NeMoGymServerClient(
        global_config_dict={"token_id_capture": {"enabled": True, "dir": str(captures)}}
    )
    server = TokenAdapter(config={"name": "adapter"}, server_client=client)
    assert server.uses_setup_webserver()
    with running_server(server) as url:
        prefix = f"{url}/ng-rollout/fa-1/training-token-capture/v1/responses"
        first = _post(prefix, {"input": [USER]})
        _post(prefix, {"input": [USER, *first["output"], {"role": "user", "content": "more"}]})
    entries = sorted(TokenCaptureStore(captures).read_entries("fa-1"), key=lambda e: len(e.prompt_token_ids))
    assert [e.parent_resolution for e in entries] == [
        ParentResolutionStatus.ROOT,
        ParentResolutionStatus.RESOLVED,
    ]


def test_nemo_gym_0_6_0s_lineage_store_name_is_the_lineage_protocol(tmp_path: Path) -> None:
    """0.6.0's vllm_model tests import ``LineageStore`` (0.7.0 dropped the name) and type their
    own external store by it; the lineage stores here satisfy it, an object without ``resolve`` does not."""
    import nemo_gym.token_id_capture as capture

    assert "LineageStore" in capture.__all__
    assert capture.LineageStore is capture.LineageResolver
    assert isinstance(capture.InMemoryLineageStore(), capture.LineageStore)
    assert isinstance(capture.FileLineageStore(tmp_path), capture.LineageStore)
    assert not isinstance(object(), capture.LineageStore)
