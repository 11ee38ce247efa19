#!/usr/bin/env bash
# Watch a policy learn: install the cpu and trl extras (and openenv, for --via openenv), then train a tiny local model with TRL's GRPO
# on CPU, every reward from a running mcqa resources server's /verify (scripts/train_trl.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NEMO_GYM_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[cpu,trl]"
"$VENV/bin/python" -m pip install -q -e ".[openenv]" >/dev/null 2>&1 || echo "note: no openenv-core; --via openenv will fail" >&2
# `bash scripts/train_trl.sh agent [...]`: the multi-turn, tool-using run (scripts/train_trl_agent.py).
if [ "${1:-}" = agent ]; then shift; exec "$VENV/bin/python" scripts/train_trl_agent.py "$@"; fi
exec "$VENV/bin/python" scripts/train_trl.py "$@"
