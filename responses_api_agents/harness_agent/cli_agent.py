"""A coding-agent CLI from npm (Claude Code, Codex, OpenCode, Gemini CLI) as a harness_agent program.

Each CLI agent folder (``claude_code_agent``, ``codex_agent``, ``opencode_agent``,
``gemini_cli_agent``) subclasses :class:`CLIHarnessAgent` and says only how its CLI is started:
the argv, the environment variables and config files that point it at the rollout's capture
proxy URL in the dialect it speaks and keep it off the network. Everything else is
harness_agent's: the confinement, the limits, the capture of every model call with its token
IDs, the assembled response and ``/verify``.

Per rollout the CLI gets a private ``HOME`` (``<workdir>/.home``, deleted with the working
directory) and a scrubbed environment: ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` and its own
variables, nothing of the agent's. The prompt is the row's request as text
(:func:`prompt_of`): ``instructions`` and the user messages; the CLI's own tools (a shell,
file edits) run in the working directory, inside the confinement.

The CLIs come from npm (``npm install --prefix <cli_dir> @anthropic-ai/claude-code @openai/codex
opencode-ai @google/gemini-cli``); ``cli_dir`` defaults to ``$NEMO_GYM_AGENT_CLI_DIR``, else
``~/.cache/nemo_gym/agent_clis`` (where ``scripts/test.sh`` installs them).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from nemo_gym.base_responses_api_agent import HTTPError
from nemo_gym.response_items import content_text
from responses_api_agents.harness_agent.app import HarnessAgent, HarnessAgentConfig

CLI_DIR_ENV = "NEMO_GYM_AGENT_CLI_DIR"
NPM_PACKAGES = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "opencode": "opencode-ai",
    "gemini": "@google/gemini-cli",
}
"""The npm package of each CLI's executable."""
PROXY_API_KEY = "nemo-gym-capture-proxy"
"""The API key every CLI is given: the proxy needs none, the CLIs refuse to start without one."""


def default_cli_dir() -> Path:
    """Where the CLIs are installed: ``$NEMO_GYM_AGENT_CLI_DIR``, else ``~/.cache/nemo_gym/agent_clis``."""
    configured = os.environ.get(CLI_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "nemo_gym" / "agent_clis"


def cli_executable(name: str, cli_dir: str | Path | None = None) -> Path | None:
    """The installed executable of CLI ``name`` (``claude``, ``codex``, ...), or None when missing."""
    path = Path(cli_dir or default_cli_dir()) / "node_modules" / ".bin" / name
    return path if path.exists() else None


def prompt_of(row: dict[str, Any]) -> tuple[str, str]:
    """``(system text, prompt text)`` of a row: its ``instructions`` (and system/developer
    messages), and its user messages joined by blank lines."""
    params = row.get("responses_create_params") or {}
    raw = params.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])
    system = [str(params.get("instructions") or "")]
    user = []
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        text = content_text(item.get("content"))
        (system if item.get("role") in ("system", "developer") else user).append(text)
    return "\n\n".join(s for s in system if s), "\n\n".join(u for u in user if u)


@dataclass
class CLIProgram:
    """How to start a CLI for one rollout: argv, its own environment variables, files under HOME."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


class CLIAgentConfig(HarnessAgentConfig):
    """harness_agent's fields (``command`` unused) plus what every CLI agent takes.

    ``cli_dir``: the ``npm install --prefix`` folder (default :func:`default_cli_dir`).
    ``model``: the model name the CLI is told (the proxy serves the policy model whatever it is).
    ``system_prompt``: replaces the CLI's system prompt where it allows, else is prepended to the
    prompt. ``extra_args``: appended to the CLI's argv. ``timeout``: NeMo Gym's name for the
    wall limit in seconds (overrides ``wall_time_s``). Node-based CLIs reserve much address
    space, hence the larger ``memory_mb``.
    """

    command: list[str] = Field(default_factory=list)
    cli_dir: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    timeout: float | None = Field(default=None, gt=0)
    memory_mb: int = Field(default=65536, ge=64)
    wall_time_s: float = Field(default=600.0, gt=0)
    cpu_time_s: float = Field(default=600.0, gt=0)
    open_files: int = Field(default=4096, ge=16)
    concurrency: int | None = None


class CLIHarnessAgent(HarnessAgent):
    """Runs one npm coding-agent CLI per rollout through harness_agent (see the module doc)."""

    config: CLIAgentConfig
    executable: ClassVar[str] = ""
    """The CLI's executable under ``node_modules/.bin``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.timeout is not None:
            self.limits = dataclasses.replace(self.limits, wall_time_s=float(self.config.timeout))

    def tools_url_extra(self) -> list[str]:
        """None: a CLI's ``allowed_tools`` (where it has one) names its own tools, not the tools URL's."""
        return []

    def cli_program(self, url: str, home: Path, workdir: str, system: str, prompt: str) -> CLIProgram:
        """The CLI's argv, variables and config files for a rollout whose proxy URL is ``url``."""
        raise NotImplementedError

    def program(self, url: str, workdir: str, row: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The CLI's argv and scrubbed environment; its config files written under a private HOME."""
        executable = cli_executable(self.executable, self.config.cli_dir)
        if executable is None:
            where = self.config.cli_dir or default_cli_dir()
            raise HTTPError(
                500,
                f"agent {self.name}: the {self.executable!r} CLI is not installed under {where}; install it "
                f"with `npm install --prefix {where} {NPM_PACKAGES.get(self.executable, self.executable)}` "
                f"or set cli_dir",
            )
        home = Path(workdir, ".home")
        home.mkdir(mode=0o700)
        system, prompt = prompt_of(row)
        if self.config.system_prompt is not None:
            system = self.config.system_prompt
        program = self.cli_program(url, home, workdir, system, prompt)
        for relative, text in program.files.items():
            target = home / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        tmp = home / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {
            "PATH": f"{executable.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(tmp),
            **program.env,
            **self.config.env,
        }
        return [str(executable), *program.argv, *self.config.extra_args], env
