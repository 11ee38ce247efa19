"""Names a public module serves from the internals on first use (for environment folders).

Environment folders import nemo_gym's public paths only; the server building blocks they need
(streaming helpers, the upstream client, the agent hops, ...) live in the internals. A public
module answers its module ``__getattr__`` with :func:`served_name`, which finds the name in
:data:`SERVED_TO_ENVIRONMENTS` (here, in one visible list) and imports the internal module only
when a server asks for one of its names: a server pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import Any

# What each public module serves: {public module: {internal module: "name name ..."}}.
SERVED_TO_ENVIRONMENTS: dict[str, dict[str, str]] = {
    "nemo_gym.base_resources_server": {
        "nemo_gym.collection.metrics": "compute_aggregate_metrics",
        "nemo_gym.serving.request_guard": "json_nesting_depth",
        "nemo_gym.serving.server": "HTTPError SESSION_COOKIE ServerRef json_response validation_error_body",
    },
    "nemo_gym.base_responses_api_agent": {
        "nemo_gym.agents.agent_hops": (
            "call_json call_model callable_tools execute_tool_call execute_tool_calls offered_tools "
            "rollout_deadline"
        ),
        "nemo_gym.agents.hop_faults": (
            "HopFault chat_completion_problem responses_object_problem status_failure_class"
        ),
        "nemo_gym.agents.mcp_tools": "MCPServerConfig MCPToolbox close_stdio",
        "nemo_gym.agents.model_conversation": "ModelConversation",
    },
    "nemo_gym.server_utils": {
        "nemo_gym.serving": "local_socket",
        "nemo_gym.serving.access_guard": "AccessGuard",
        "nemo_gym.serving.cpu_scheduling": "default_scheduling",
        "nemo_gym.serving.server": (
            "RequestGuard bind_socket json_error_handlers make_uvicorn_server parse_json_object"
        ),
    },
    "nemo_gym.base_responses_api_model": {
        "nemo_gym.engine.tiny_model": "build_tiny_model",
        "nemo_gym.models": "vllm_compat",
        "nemo_gym.models.anthropic_messages": (
            "messages_request_to_responses_params messages_response_events response_to_messages_response"
        ),
        "nemo_gym.models.chat_backend": "ChatBridge is_context_length_error template_messages",
        "nemo_gym.models.chat_stream": (
            "ChatCompletionAccumulator ResponsesEventStream THINK_CLOSE THINK_OPEN held_tail"
        ),
        "nemo_gym.models.chat_tools": "ConversionUnsupported",
        "nemo_gym.models.conversation_store": "current_conversation",
        "nemo_gym.models.conversion": (
            "TOKEN_ID_FIELDS chat_request_to_responses_params response_to_chat_completion"
        ),
        "nemo_gym.models.dialect_routes": "GEMINI_ACTIONS",
        "nemo_gym.models.gemini_api": (
            "gemini_request_to_responses_params gemini_stream_chunks json_answer json_schema_request "
            "response_to_gemini_response schema_default_instance"
        ),
        "nemo_gym.models.media": "MediaLimitError MediaLimits check_chat_media media_kind",
        "nemo_gym.models.prompt_token_cache": "PromptTokenCache",
        "nemo_gym.models.stream_requests": (
            "CHAT_REQUEST_FIELDS NamespaceMap RESPONSES_REQUEST_FIELDS restore_namespace_calls "
            "sanitize_chat_body sanitize_responses_body"
        ),
        "nemo_gym.models.streaming": "chat_completion_chunks response_events sse_body sse_response",
        "nemo_gym.models.token_ids": (
            "TokenSpliceError detect_turn_end_token_ids render_chat_token_ids spliced_prompt_token_ids"
        ),
        "nemo_gym.models.token_memory": "TokenIdMemory",
        "nemo_gym.serving.server": "ServerRef",
        "nemo_gym.serving.sse": "EventStreamResponse SSEParser error_event relay_events sse_bytes",
        "nemo_gym.serving.upstream": "EncodedJSON UpstreamError UpstreamHTTP UpstreamResponse error_message",
    },
}


def served_name(name: str, where: str) -> Any:
    """``name`` as the public module ``where`` serves it (a submodule is served too).

    Raises ``AttributeError`` (as a module does) when ``where`` does not serve ``name``.
    """
    for module, names in SERVED_TO_ENVIRONMENTS.get(where, {}).items():
        if name in names.split():
            found = importlib.import_module(module)
            if hasattr(found, name):
                return getattr(found, name)
            return importlib.import_module(f"{module}.{name}")
    raise AttributeError(f"module {where!r} has no attribute {name!r}")
