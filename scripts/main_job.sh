#!/usr/bin/env bash
# The main job end to end: install, start a stack, collect rollouts on example data, print metrics, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NEMO_GYM_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[cpu,verifiers]"
exec "$VENV/bin/python" -m nemo_gym.tools.main_job "$@"
