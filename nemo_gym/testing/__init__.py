"""Test support: real servers on 127.0.0.1, driven from synchronous test code.

- :func:`running_server` serves one server object in this process on a free loopback port.
- :func:`running_stack` starts a whole stack from config files with ``ng_run``'s machinery
  (real child processes) and stops it afterwards.
- :class:`SyncClient` makes blocking JSON calls with per-server cookie jars, for tests.

- :func:`gym_project` makes a fresh project to pull NeMo Gym's folders into and run ``gym`` in;
  :func:`write_files` lays out a wheel's or a project's files for a test.

Each idea lives in its own module (``servers``, ``stacks``, ``http_clients``, ``jsonl_rows``,
``verify_cases``, ``session_conformance``, ``gym_projects``); this package re-exports them.
``cpu_engine`` (the CPU engine with forced completions, for token-ID tests) and ``package_index``
(a package index on loopback, wheels and layered environments for pip) are imported by path.
"""

from __future__ import annotations

from nemo_gym.testing.gym_projects import GymProject, gym_project, write_files
from nemo_gym.testing.http_clients import SyncClient, http_call
from nemo_gym.testing.jsonl_rows import distinct_example_rows, read_jsonl, write_jsonl
from nemo_gym.testing.servers import (
    fake_openai_responses,
    lazy_servers,
    running_agent,
    running_aiohttp_app,
    running_app,
    running_server,
    serving_aiohttp_app,
)
from nemo_gym.testing.stacks import (
    SCRIPTED_MODEL_CONFIG,
    collect_examples,
    collect_with_stack,
    collector_argv,
    ng_run_process,
    running_stack,
)
from nemo_gym.testing.verify_cases import (
    HELD_OUT_EVERY,
    ParityCase,
    check_parity,
    compat_dir,
    compat_root,
    parity_cases,
    post_verify,
    replay_recorded,
    verify_text,
)

__all__ = [
    "HELD_OUT_EVERY",
    "GymProject",
    "SCRIPTED_MODEL_CONFIG",
    "ParityCase",
    "SyncClient",
    "check_parity",
    "collect_examples",
    "collect_with_stack",
    "collector_argv",
    "compat_dir",
    "compat_root",
    "distinct_example_rows",
    "fake_openai_responses",
    "gym_project",
    "http_call",
    "lazy_servers",
    "ng_run_process",
    "parity_cases",
    "post_verify",
    "read_jsonl",
    "replay_recorded",
    "running_agent",
    "running_aiohttp_app",
    "running_app",
    "running_server",
    "running_stack",
    "serving_aiohttp_app",
    "verify_text",
    "write_files",
    "write_jsonl",
]
