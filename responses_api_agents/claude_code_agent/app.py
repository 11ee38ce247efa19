"""claude_code_agent: Claude Code (``@anthropic-ai/claude-code``) as an agent of this stack, through harness_agent.

``claude -p`` runs per rollout in harness_agent's confinement with a private ``HOME``,
``ANTHROPIC_BASE_URL`` at the rollout's capture proxy URL (Anthropic Messages, streaming):
every model call is recorded with its token IDs and the rollout is verified on what the policy
produced. Telemetry, the auto-updater, error reporting and other non-essential traffic are off;
permissions are skipped (``IS_SANDBOX=1`` lets it do so as root: the confinement is the
sandbox). NeMo Gym's ``claude_code_agent`` fields are read (``model``, ``max_turns``,
``system_prompt``, ``allowed_tools``, ``disallowed_tools``, ``bare``, ``mcp_config``,
``settings``, ``timeout``) plus ``tools`` (Claude Code's ``--tools``: which built-in tools exist);
``anthropic_api_key``, ``anthropic_base_url`` and ``claude_code_version`` are accepted and unused.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from responses_api_agents.harness_agent.cli_agent import (
    PROXY_API_KEY,
    CLIAgentConfig,
    CLIHarnessAgent,
    CLIProgram,
)


class ClaudeCodeAgentConfig(CLIAgentConfig):
    """CLI agent fields plus Claude Code's (see the module doc and README.md)."""

    model: str | None = "claude-sonnet-4-6"
    max_turns: int | None = 30
    allowed_tools: str | None = None
    disallowed_tools: str | None = None
    tools: str | None = None
    bare: bool = True
    mcp_config: str | None = None
    settings: str | None = None
    anthropic_api_key: str | None = None
    anthropic_base_url: str | None = None
    claude_code_version: str | None = None


class ClaudeCodeAgent(CLIHarnessAgent):
    """``claude -p --output-format json`` per rollout, its API the capture proxy."""

    config: ClaudeCodeAgentConfig
    executable: ClassVar[str] = "claude"

    def cli_program(self, url: str, home: Path, workdir: str, system: str, prompt: str) -> CLIProgram:
        config = self.config
        argv = ["-p", prompt, "--output-format", "json", "--dangerously-skip-permissions"]
        argv += ["--model", config.model or "policy"]
        if config.bare:
            argv.append("--bare")
        if config.max_turns is not None:
            argv += ["--max-turns", str(config.max_turns)]
        if config.system_prompt is not None:
            argv += ["--system-prompt", config.system_prompt]
        elif system:
            argv += ["--append-system-prompt", system]
        for flag, value in (
            ("--tools", config.tools),
            ("--allowedTools", config.allowed_tools),
            ("--disallowedTools", config.disallowed_tools),
            ("--mcp-config", config.mcp_config),
            ("--settings", config.settings),
        ):
            if value is not None:
                argv += [flag, value]
        env = {
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": PROXY_API_KEY,
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",
        }
        return CLIProgram(argv, env)


if __name__ == "__main__":
    ClaudeCodeAgent.run_webserver()
