"""codex_agent: the Codex CLI (``@openai/codex``) as an agent of this stack, through harness_agent.

``codex exec`` runs per rollout in harness_agent's confinement with a private ``CODEX_HOME``
whose ``config.toml`` points its one model provider at the rollout's capture proxy URL
(Responses API, streaming): every model call is recorded with its token IDs and the rollout is
verified on what the policy produced. Nothing reaches the network: update checks, plugins,
remote plugins, apps and web search are off. NeMo Gym's ``codex_agent`` config fields are read
(``model``, ``sandbox_mode``, ``system_prompt``, ``reasoning_effort``, ``timeout``,
``extra_config``); ``openai_api_key``/``openai_base_url``/``codex_version`` are accepted and
unused (the proxy is the endpoint; the installed CLI runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from responses_api_agents.harness_agent.cli_agent import (
    PROXY_API_KEY,
    CLIAgentConfig,
    CLIHarnessAgent,
    CLIProgram,
)


class CodexAgentConfig(CLIAgentConfig):
    """CLI agent fields plus Codex's (see the module doc and README.md)."""

    sandbox_mode: str = "danger-full-access"
    reasoning_effort: str | None = None
    base_instructions: str | None = None
    extra_config: dict[str, Any] = Field(default_factory=dict)
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    codex_version: str | None = None
    cwd: str | None = None
    stream_idle_timeout_ms: int | None = None


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` merged over ``base``, tables merged key by key."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def toml_text(config: dict[str, Any], prefix: str = "") -> str:
    """``config`` as TOML: scalars and arrays first, then each table (values JSON-quoted, which
    TOML reads for strings, numbers, booleans and arrays of them)."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in config.items() if not isinstance(value, dict)]
    for key, value in config.items():
        if isinstance(value, dict):
            name = f"{prefix}{json.dumps(key)}"
            lines.append(f"\n[{name}]")
            lines.append(toml_text(value, f"{name}."))
    return "\n".join(line for line in lines if line) + "\n"


class CodexAgent(CLIHarnessAgent):
    """``codex exec --json`` per rollout, its provider the capture proxy."""

    config: CodexAgentConfig
    executable: ClassVar[str] = "codex"

    def cli_program(self, url: str, home: Path, workdir: str, system: str, prompt: str) -> CLIProgram:
        config: dict[str, Any] = {
            "model": self.config.model or "policy",
            "model_provider": "nemo_gym",
            "check_for_update_on_startup": False,
            "web_search": "disabled",
            "model_providers": {
                "nemo_gym": {
                    "name": "nemo_gym",
                    "base_url": f"{url}/v1",
                    "env_key": "OPENAI_API_KEY",
                    "wire_api": "responses",
                    "request_max_retries": 0,
                    "stream_max_retries": 0,
                    "stream_idle_timeout_ms": self.config.stream_idle_timeout_ms
                    or int(self.limits.wall_deadline_s * 1000),
                }
            },
            "features": {"plugins": False, "remote_plugin": False, "apps": False},
        }
        files = {}
        if system:
            config["developer_instructions"] = system
        if self.config.reasoning_effort:
            config["model_reasoning_effort"] = self.config.reasoning_effort
        if self.config.base_instructions is not None:
            files[".codex/instructions.md"] = self.config.base_instructions
            config["model_instructions_file"] = str(home / ".codex/instructions.md")
        files[".codex/config.toml"] = toml_text(deep_merge(config, self.config.extra_config))
        argv = ["exec", "--skip-git-repo-check", "--json", "--sandbox", self.config.sandbox_mode, prompt]
        env = {"CODEX_HOME": str(home / ".codex"), "OPENAI_API_KEY": PROXY_API_KEY}
        return CLIProgram(argv, env, files)


if __name__ == "__main__":
    CodexAgent.run_webserver()
