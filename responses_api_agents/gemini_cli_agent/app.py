"""gemini_cli_agent: Gemini CLI (``@google/gemini-cli``) as an agent of this stack, through harness_agent.

``gemini -p`` runs per rollout in harness_agent's confinement with a private ``HOME`` whose
``.gemini/settings.json`` selects API-key auth, trusts no folder prompt, and turns telemetry,
usage statistics and auto-update off; ``GOOGLE_GEMINI_BASE_URL`` is the rollout's capture proxy
URL (the Gemini API, streaming): every model call is recorded with its token IDs and the
rollout is verified on what the policy produced. Its tools run without asking
(``--approval-mode yolo``). NeMo Gym has no Gemini CLI agent; the fields follow the other CLI
agents: ``model``, ``system_prompt`` (its ``GEMINI_SYSTEM_MD`` file), ``timeout``,
``extra_args``, ``env``, ``settings`` (merged over the generated settings).
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


class GeminiCLIAgentConfig(CLIAgentConfig):
    """CLI agent fields plus Gemini CLI's ``settings`` (merged into ``settings.json``)."""

    model: str | None = "gemini-2.5-pro"
    settings: dict[str, Any] = Field(default_factory=dict)


class GeminiCLIAgent(CLIHarnessAgent):
    """``gemini -p --output-format json --approval-mode yolo`` per rollout, its API the capture proxy."""

    config: GeminiCLIAgentConfig
    executable: ClassVar[str] = "gemini"

    def cli_program(self, url: str, home: Path, workdir: str, system: str, prompt: str) -> CLIProgram:
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        }
        settings = deep_merge(settings, self.config.settings)
        files = {".gemini/settings.json": json.dumps(settings, indent=1)}
        env = {
            "GEMINI_API_KEY": PROXY_API_KEY,
            "GOOGLE_GEMINI_BASE_URL": url,
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }
        if system:
            files[".gemini/system.md"] = system
            env["GEMINI_SYSTEM_MD"] = str(home / ".gemini/system.md")
        argv = ["-p", prompt, "--output-format", "json", "--approval-mode", "yolo"]
        argv += ["--model", self.config.model or "policy"]
        return CLIProgram(argv, env, files)


if __name__ == "__main__":
    GeminiCLIAgent.run_webserver()
