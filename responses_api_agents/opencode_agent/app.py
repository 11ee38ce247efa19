"""opencode_agent: the OpenCode CLI (``opencode-ai``) as an agent of this stack, through harness_agent.

``opencode run --format json`` runs per rollout in harness_agent's confinement with a private
``XDG_CONFIG_HOME`` whose ``opencode/opencode.json`` defines one provider, its bundled
``@ai-sdk/openai-compatible`` package pointed at the rollout's capture proxy URL (Chat
Completions, streaming): every model call is recorded with its token IDs and the rollout is
verified on what the policy produced. Auto-update, the models.dev fetch and LSP downloads are
off; its tools run without asking. NeMo Gym's ``opencode_agent`` fields are read (``model``,
``system_prompt``, ``timeout``, ``extra_args``, ``env``, ``opencode_config`` merged over the
generated config); ``command``, ``openai_api_key``, ``openai_base_url``, ``workspace_root``,
``setup_timeout``, ``thinking`` and ``opencode_version`` are accepted and unused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from responses_api_agents.codex_agent.app import deep_merge
from responses_api_agents.harness_agent.cli_agent import (
    PROXY_API_KEY,
    CLIAgentConfig,
    CLIHarnessAgent,
    CLIProgram,
)

PROVIDER = "nemo_gym"


class OpenCodeAgentConfig(CLIAgentConfig):
    """CLI agent fields plus OpenCode's (see the module doc and README.md)."""

    opencode_config: dict[str, Any] = Field(default_factory=dict)
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    workspace_root: str | None = None
    thinking: bool = False
    setup_timeout: float | None = None
    opencode_version: str | None = None


class OpenCodeAgent(CLIHarnessAgent):
    """``opencode run --format json`` per rollout, its provider the capture proxy."""

    config: OpenCodeAgentConfig
    executable: ClassVar[str] = "opencode"

    def cli_program(self, url: str, home: Path, workdir: str, system: str, prompt: str) -> CLIProgram:
        # A provider/model name keeps only its last part: OpenCode addresses it as provider/model.
        model = (self.config.model or "policy").rsplit("/", 1)[-1]
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "permission": {"bash": "allow", "edit": "allow", "webfetch": "deny"},
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": {"baseURL": f"{url}/v1", "apiKey": PROXY_API_KEY},
                    "models": {model: {"tool_call": True}},
                }
            },
            "model": f"{PROVIDER}/{model}",
            "small_model": f"{PROVIDER}/{model}",
        }
        if system:
            config["agent"] = {"build": {"prompt": system}}
        config = deep_merge(config, self.config.opencode_config)
        env = {
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local/state"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        files = {".config/opencode/opencode.json": json.dumps(config, indent=1)}
        return CLIProgram(["run", "--format", "json", prompt], env, files)


if __name__ == "__main__":
    OpenCodeAgent.run_webserver()
