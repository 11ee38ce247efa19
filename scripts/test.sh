#!/usr/bin/env bash
# Run the test suite: creates .venv if needed, installs the project with every extra, runs lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${NEMO_GYM_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch is pinned inside the [cpu] extra: an unpinned torch would pull a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q -e ".[cpu,verifiers,dev,ray,gym]"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy" nemo_gym
"$VENV/bin/python" -m pytest -q "$@"
