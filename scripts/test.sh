#!/usr/bin/env bash
# Run the test suite: creates .venv if needed, installs the project with every extra, runs lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NEMO_GYM_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch is pinned inside the [cpu] extra: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q -e ".[cpu,verifiers,dev,ray,gym,wandb,mlflow,trl]"
# OpenEnv's client (openenv-core, which brings gradio) for tests/test_openenv_bridge.py: a separate
# step so that a resolver failure there costs only those tests (they skip and say why).
"$VENV/bin/python" -m pip install -q -e ".[openenv]" >/dev/null 2>&1 \
  || echo "note: could not install openenv-core; the OpenEnv bridge tests will skip" >&2
"$VENV/bin/python" -m pip install -q -e ".[verifiers_agent]" >/dev/null 2>&1 \
  || echo "note: could not install verifiers; tests/test_verifiers_pulled_agent.py will skip" >&2
"$VENV/bin/python" -m pip install -q -e ".[skyrl,textarena]" >/dev/null 2>&1 \
  || echo "note: could not install skyrl-gym/textarena; skyrl_gym_env's and textarena_env's tests will skip" >&2
# GEM (gem-llm) pins reasoning-gym and nltk exactly, against the verifiers extra: without its deps.
"$VENV/bin/python" -m pip install -q --no-deps "gem-llm>=0.1" >/dev/null 2>&1 \
  || echo "note: could not install gem-llm; resources_servers/gem_env's tests will skip" >&2
# The viewer's browser tests drive Debian's chromium (a browser download at install time fails
# here); install it when we can, quietly. Without it those tests skip and say why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "note: could not install chromium; the viewer's browser tests will skip" >&2
fi
# A real container engine for the docker/podman sandbox providers' tests (tests/test_sandbox_podman.py):
# Debian's podman serving the Docker Engine API, runc, and busybox-static for an offline image.
# Without them (not root, no apt) those tests skip and say why.
if { ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 || [ ! -x /bin/busybox ]; } \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc busybox-static) \
    >/dev/null 2>&1 || echo "note: could not install podman; the container sandbox tests will skip" >&2
fi
# tests/slurm runs a real two-node Slurm cluster (Debian's slurmctld, slurmd, munge; a network
# namespace per node): installed here as root when missing, quietly. Otherwise those tests skip.
if ! command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge) >/dev/null 2>&1 \
    || echo "note: could not install Slurm; tests/slurm will skip" >&2
fi
# The coding-agent CLIs that tests/test_agent_clis_e2e.py runs as agents, from npm, once: they
# stay cached in $NEMO_GYM_AGENT_CLI_DIR (default ~/.cache/nemo_gym/agent_clis) between runs.
# Without npm (or the registry) those tests skip and say why.
CLI_DIR="${NEMO_GYM_AGENT_CLI_DIR:-$HOME/.cache/nemo_gym/agent_clis}"
if command -v npm >/dev/null 2>&1 && [ ! -x "$CLI_DIR/node_modules/.bin/gemini" ]; then
  mkdir -p "$CLI_DIR"
  npm install --prefix "$CLI_DIR" --no-audit --no-fund --loglevel=error \
    @anthropic-ai/claude-code @openai/codex opencode-ai @google/gemini-cli >/dev/null 2>&1 \
    || echo "note: could not install the agent CLIs from npm; their tests will skip" >&2
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy" nemo_gym
"$VENV/bin/python" -m pytest -q "$@"
