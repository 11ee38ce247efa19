"""Our own servers stay lean: no ``openai`` and no FastAPI in their processes, even after a rollout.

Both packages are for NeMo Gym-style environments (typed ``openai`` models, FastAPI routes);
importing them costs every server process ~0.3 s of start-up and ~30 MiB (docs/PERFORMANCE.md).
The stack runs under ``ng_run`` as real processes; a ``sitecustomize`` on their path records,
when the test asks (after a rollout), the modules each process has loaded and who first
imported a watched package.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from nemo_gym.testing import ng_run_process

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
# mcp and omegaconf too: ~0.5 s and ~17 MiB, ~5 MiB; a server needs neither unless configured to.
WATCHED = ("openai", "fastapi", "mcp", "omegaconf")

# Loaded first in every Python process started with this folder on its path. Servers die by
# SIGTERM (no atexit), so a thread writes the record once the test creates the trigger file.
SITECUSTOMIZE = """
import json, os, sys, threading, time, traceback

_WATCHED = {watched!r}
_FIRST = {{}}


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name in _WATCHED and name not in _FIRST:
            _FIRST[name] = "".join(f for f in traceback.format_stack(limit=40) if "<frozen" not in f)
        return None


def _record_when_asked():
    folder = os.environ["NG_TEST_MODULES_DIR"]
    while not os.path.exists(os.path.join(folder, "dump")):
        time.sleep(0.05)
    record = {{"instance": os.environ.get("NEMO_GYM_INSTANCE_NAME"), "argv": sys.argv,
              "modules": sorted(sys.modules), "first_imports": _FIRST}}
    with open(os.path.join(folder, f"{{os.getpid()}}.part"), "w") as f:
        json.dump(record, f)
    os.replace(os.path.join(folder, f"{{os.getpid()}}.part"), os.path.join(folder, f"{{os.getpid()}}.json"))


sys.meta_path.insert(0, _Watch())
threading.Thread(target=_record_when_asked, daemon=True).start()
"""


def server_records(folder: Path, names: set[str], timeout_s: float = 20) -> dict[str, dict]:
    """The module records of the server processes ``names``, by instance name, once all have written."""
    (folder / "dump").touch()
    deadline = time.monotonic() + timeout_s
    while True:
        found = {}
        for path in folder.glob("*.json"):
            record = json.loads(path.read_text())
            if record["instance"]:
                found[record["instance"]] = record
        if names <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_bundled_servers_import_no_openai_fastapi_mcp_or_omegaconf(tmp_path: Path) -> None:
    hook, records = tmp_path / "hook", tmp_path / "records"
    hook.mkdir()
    records.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE.format(watched=WATCHED))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "NG_TEST_MODULES_DIR": str(records),
    }
    with ng_run_process(CONFIGS, env=env, timeout_s=60) as (_, head_url):
        with urllib.request.urlopen(head_url + "/server_instances", timeout=10) as resp:
            urls = {i["name"]: i["url"] for i in json.load(resp)}

        # One whole rollout: seed, model, tool, model, verify, so the hot paths have run too.
        row_line = (ROOT / "resources_servers/example_single_tool_call/data/example.jsonl").read_text()
        row = json.loads(row_line.splitlines()[0])
        answer = post_json(urls["example_single_tool_call_simple_agent"] + "/run", row)
        assert answer["reward"] == 1.0, answer
        expected = {"example_single_tool_call", "example_single_tool_call_simple_agent", "policy_model"}
        by_instance = server_records(records, expected)

    assert expected <= set(by_instance), f"no module record from {expected - set(by_instance)}"
    # The record is real: each server process shows its own base module.
    assert "nemo_gym.base_resources_server" in by_instance["example_single_tool_call"]["modules"]
    assert (
        "nemo_gym.base_responses_api_agent" in by_instance["example_single_tool_call_simple_agent"]["modules"]
    )
    for name in sorted(expected):
        record = by_instance[name]
        loaded = [m for m in WATCHED if m in record["modules"]]
        assert not loaded, f"{name} imported {loaded}; first import:\n" + "\n".join(
            record["first_imports"].get(m, "") for m in loaded
        )
