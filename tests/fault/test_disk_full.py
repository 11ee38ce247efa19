"""A full disk while collecting: one clear line naming the file, no traceback; a resume finishes.

The results file is a link to ``/dev/full`` (every write fails with ENOSPC, as on a full disk),
the collector a real ``ng_collect_rollouts`` process against a real stack.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nemo_gym.launch.config import project_root
from nemo_gym.testing import collector_argv, read_jsonl, running_stack

CONFIGS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/scripted_model/configs/scripted_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
SOURCE = project_root() / "resources_servers/example_single_tool_call/data/example.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_named_and_a_resume_finishes(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    out.symlink_to("/dev/full")
    with running_stack(CONFIGS) as stack:
        port = int(stack.head_url.rsplit(":", 1)[1])
        argv = collector_argv(port, AGENT, SOURCE, out, "+limit=2")
        done = subprocess.run(argv, cwd=project_root(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stderr[-2000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert f"disk full: cannot write {out}" in done.stderr and "resume_from_cache" in done.stderr
        # Space again: the same command with resume finishes every row.
        out.unlink()
        again = subprocess.run(
            [*argv, "+resume_from_cache=true"],
            cwd=project_root(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr[-2000:]
    assert len(read_jsonl(out)) == 2
