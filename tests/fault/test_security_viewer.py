"""The viewer, a real ``ng_viewer`` process: a DNS-rebinding Host and a cross-site Origin are
refused, the token guards it, and a hostile rollouts file (``_ng_task_index`` past 64 bits)
is a bad line, not a crash."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest

from nemo_gym.serving.protocol import ENV_AUTH_TOKEN
from nemo_gym.testing import http_call

pytestmark = pytest.mark.slow
TOKEN = "viewer-security-token-61a9"


def row(task: int, reward: float) -> dict:
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
        "reward": reward,
        "responses_create_params": {"input": "hi"},
        "response": {"output": []},
    }


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    path = tmp_path_factory.mktemp("viewer") / "rollouts.jsonl"
    rows = [row(0, 1.0), row(2**63, 1.0), row(-5, 0.0), row(1, 0.0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json: ints past 64 bits too
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.viewer.app", f"+input={path}", "+port=0"],
        env={**os.environ, ENV_AUTH_TOKEN: TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found: list[str] = []
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"Viewer: (http://\S+?)/", line)
            if match:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert ready.wait(60) and found, "".join(lines)
        yield found[0]
    finally:
        proc.kill()
        proc.wait(10)


def test_hostile_task_indexes_are_bad_lines_not_a_crash(viewer):
    status, overview = http_call(viewer + "/api/overview?c=0", token=TOKEN)
    assert status == 200, overview
    assert overview["bad_lines"] == 2, overview
    status, listed = http_call(viewer + "/api/collections", token=TOKEN)
    assert status == 200 and listed["collections"][0]["rows"] == 4, listed
    status, page = http_call(viewer + "/api/rollout?c=0&row=1", token=TOKEN)
    assert status == 200 and page["data"]["_ng_task_index"] == 2**63, page


def test_rebinding_cross_site_and_no_token_are_refused(viewer):
    port = urlsplit(viewer).port
    status, answer = http_call(
        viewer + "/api/collections", token=TOKEN, headers={"Host": f"evil.example:{port}"}
    )
    assert status == 400 and "evil.example" in answer["error"], answer
    status, answer = http_call(
        viewer + "/api/collections", token=TOKEN, headers={"Origin": "http://evil.example"}
    )
    assert status == 403 and "cross-site" in answer["error"], answer
    status, answer = http_call(viewer + "/api/collections")
    assert status == 401, answer
    assert (
        http_call(viewer + "/api/collections", token=TOKEN, headers={"Host": f"localhost:{port}"})[0] == 200
    )
