"""[VIEWER] ng_viewer over HTTP: every page's API on a collection the main job made.

The main job (``python -m nemo_gym.tools.main_job``, the README's path: CPU engine, tiny model, token
IDs on) collects the example environment with forced completions (a tool call, then an answer:
reward 1, two model calls per rollout). ``ng_viewer`` runs as a real process over it and over
a copy whose rewards were edited (for Compare); the other tests serve the app on loopback in a
thread over files derived from that collection (growing, rewritten, with failures, bad lines).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.serving.server import bind_socket, make_uvicorn_server
from nemo_gym.viewer.app import TOKEN_COOKIE, Viewer, build_app
from nemo_gym.viewer.collection import Collection
from nemo_gym.viewer.index import INDEX_SUFFIX, RowIndex

pytestmark = pytest.mark.slow

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "Cold in Oslo: bring a jacket.",
]


def run_main_job(output: Path, *overrides: str) -> str:
    """Run the README's main job into ``output``; returns its stdout."""
    forced = output.parent / "forced.yaml"
    engine = {"forced_completions": FORCED, "default_max_tokens": 48}
    forced.write_text(
        yaml.safe_dump({"local_hf_engine": {"responses_api_models": {"local_hf_model": engine}}})
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nemo_gym.tools.main_job",
            f"+output_jsonl_fpath={output}",
            "+num_repeats=2",
            f"+config_paths=[{forced}]",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return status, json.loads(body)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The main job's collection (A), and B: A with task 0 failing in both repeats and task 1 in one."""
    root = tmp_path_factory.mktemp("viewer")
    a = root / "a" / "rollouts.jsonl"
    a.parent.mkdir()
    stdout = run_main_job(a)
    b = root / "b" / "rollouts.jsonl"
    b.parent.mkdir()
    rows = read_rows(a)
    for row in rows:
        if row["_ng_task_index"] == 0 or (row["_ng_task_index"] == 1 and row["_ng_rollout_index"] == 0):
            row["reward"] = 0.0
    write_rows(b, rows)
    return {"a": a, "b": b, "stdout": stdout, "rows": read_rows(a)}


@pytest.fixture(scope="module")
def viewer_url(job: dict[str, Any]) -> Iterator[str]:
    """``ng_viewer`` as a real process over A and B, decoding with the tiny model's tokenizer."""
    command = re.search(r"See the rollouts in the viewer: ng_viewer (.*)", job["stdout"])
    assert command, job["stdout"][-2000:]
    tokenizer = re.search(r"\+tokenizer=(\S+)", command.group(1))
    assert tokenizer and Path(tokenizer.group(1)).is_dir()
    env = {k: v for k, v in os.environ.items() if k != "NEMO_GYM_AUTH_TOKEN"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nemo_gym.viewer.app",
            f"+input={job['a']},{job['b']}",
            f"+tokenizer={tokenizer.group(1)}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            found = re.search(r"Viewer: (http://127\.0\.0\.1:\d+)/", line)
            if found:
                yield found.group(1)
                break
        else:
            pytest.fail("ng_viewer exited without serving:\n" + "".join(lines))
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def serving(viewer: Viewer, token: str | None = None) -> Iterator[str]:
    """Serve the viewer app on a free loopback port in a thread."""
    sock = bind_socket("127.0.0.1", 0)
    server = make_uvicorn_server(build_app(viewer, token=token or ""), embedded=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# ---- the README's main job --------------------------------------------------------------------
def test_main_job_prints_the_viewer_command(job: dict[str, Any]) -> None:
    assert f"See the rollouts in the viewer: ng_viewer +input={job['a']} +tokenizer=" in job["stdout"]


# ---- pages over the real collection -----------------------------------------------------------
def test_collections_lists_both_inputs(viewer_url: str, job: dict[str, Any]) -> None:
    status, body = get(f"{viewer_url}/api/collections")
    assert status == 200
    assert [c["path"] for c in body["collections"]] == [str(job["a"]), str(job["b"])]
    first = body["collections"][0]
    assert (first["rows"], first["failures"], first["expected"], first["complete"]) == (10, 0, 10, True)


def test_overview_numbers(viewer_url: str, job: dict[str, Any]) -> None:
    rows = job["rows"]
    status, o = get(f"{viewer_url}/api/overview?c=0")
    assert status == 200
    assert o["rows"] == len(rows) == 10
    assert o["num_tasks"] == len({r["_ng_task_index"] for r in rows}) == 5
    assert o["mean_reward"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))
    assert o["rows_with_token_ids"] == 10
    assert o["failures_by_class"] == {}
    (agent,) = o["agents"]
    assert agent["agent"] == "example_single_tool_call_simple_agent"
    assert (agent["rollouts"], agent["tasks"], agent["solved_always"], agent["solved_never"]) == (10, 5, 5, 0)
    assert [(p["k"], p["pass"]) for p in o["pass_at_k"]] == [(1, 100.0), (2, 100.0)]
    assert o["reward_histogram"]["bars"] == [{"label": "1", "value": 1.0, "count": 10}]
    assert o["task_pass_rates"] == [1.0] * 5
    (metrics,) = o["metrics_file"]
    assert metrics["key_metrics"]["mean/reward"] == pytest.approx(1.0)
    # pass@k is in percent in the file: the page says so beside the raw mean.
    assert metrics["units"]["mean/reward"] == "" and metrics["key_metrics"]["pass@1[avg-of-2]/reward"] == 100
    assert {k: u for k, u in metrics["units"].items() if k.startswith(("pass@", "majority@"))}
    assert all(u == "%" for k, u in metrics["units"].items() if k.startswith(("pass@", "majority@")))

    status, ob = get(f"{viewer_url}/api/overview?c=1")
    assert ob["mean_reward"] == pytest.approx(0.7)
    assert ob["agents"][0]["solved_never"] == 1
    # pass@1 over tasks: 0, 0.5, 1, 1, 1 → 70 %; pass@2: 0, 1, 1, 1, 1 → 80 %.
    assert [(p["k"], round(p["pass"], 6)) for p in ob["pass_at_k"]] == [(1, 70.0), (2, 80.0)]
    assert sorted(ob["task_pass_rates"], reverse=True) == ob["task_pass_rates"] == [1.0, 1.0, 1.0, 0.5, 0.0]


def test_tasks_filters(viewer_url: str, job: dict[str, Any]) -> None:
    status, t = get(f"{viewer_url}/api/tasks?c=1")
    assert status == 200 and t["total"] == 5
    first = t["tasks"][0]
    assert first["task"] == 0 and first["rewards"] == [0.0, 0.0] and first["n"] == 2
    assert first["prompt"] == "Should I bring a jacket in Oslo today?"
    rows_of_task_0 = [i for i, r in enumerate(job["rows"]) if r["_ng_task_index"] == 0]
    assert first["rows"] == rows_of_task_0

    def tasks(query: str) -> list[int]:
        status, body = get(f"{viewer_url}/api/tasks?c=1&{query}")
        assert status == 200, body
        return [task["task"] for task in body["tasks"]]

    assert tasks("status=never") == [0]
    assert tasks("status=mixed") == [1]
    assert tasks("status=always") == [2, 3, 4]
    assert tasks("status=failed") == []
    assert tasks("min=0.5&max=0.5") == [1]
    assert tasks("max=0.9") == [0, 1]
    assert tasks("sort=reward")[:2] == [0, 1]
    assert tasks("sort=-reward")[-1] == 0
    assert tasks("q=LISBON") == [1]
    assert tasks("q=no+such+prompt") == []
    assert tasks("agent=example_single_tool_call_simple_agent&limit=2&offset=3") == [3, 4]


@pytest.mark.parametrize(
    ("query", "status", "names"),
    [
        ("status=sometimes", 400, "status"),
        ("min=abc", 400, "min"),
        ("limit=0", 400, "limit"),
        ("agent=nobody", 400, "nobody"),
        ("c=7", 404, "c=7"),
    ],
)
def test_tasks_bad_queries_are_json_4xx(viewer_url: str, query: str, status: int, names: str) -> None:
    got, body = get(f"{viewer_url}/api/tasks?{query}")
    assert got == status
    assert names in body["error"] and body["server"] == "ng_viewer"


def test_rollout_page(viewer_url: str, job: dict[str, Any]) -> None:
    status, page = get(f"{viewer_url}/api/rollout?c=0&row=3")
    assert status == 200
    assert page["data"] == job["rows"][3]
    task = job["rows"][3]["_ng_task_index"]
    assert page["task"] == task and page["has_token_ids"] is True and page["rows"] == 10
    assert [r["row"] for r in page["repeats"]] == [
        i for i, r in enumerate(job["rows"]) if r["_ng_task_index"] == task
    ]
    output_types = [item["type"] for item in page["data"]["response"]["output"]]
    assert output_types[:2] == ["function_call", "function_call_output"]

    assert get(f"{viewer_url}/api/rollout?c=0&row=10")[0] == 404
    status, body = get(f"{viewer_url}/api/rollout?c=0&row=x")
    assert status == 400 and "row" in body["error"]
    assert get(f"{viewer_url}/api/rollout?c=0")[0] == 400
    assert get(f"{viewer_url}/api/nothing")[0] == 404


def test_tokens_page_is_the_exported_sequence(viewer_url: str, job: dict[str, Any], tmp_path: Path) -> None:
    exported = tmp_path / "train.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.train_data import ng_export_training_data as m; m()",
         f"+input_jsonl_fpath={job['a']}", f"+output_jsonl_fpath={exported}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sequences = read_rows(exported)
    for row in (0, 7):
        status, t = get(f"{viewer_url}/api/tokens?c=0&row={row}")
        assert status == 200 and t["available"] is True
        expected = sequences[row]
        assert [tok[0] for tok in t["tokens"]] == expected["input_ids"]
        assert [tok[1] for tok in t["tokens"]] == expected["loss_mask"]
        assert [tok[2] for tok in t["tokens"]] == pytest.approx(expected["logprobs"], abs=1e-5)
        assert t["verdict"] == {
            "contiguous": True,
            "num_calls": 2,
            "break_at_call": None,
            "replaced_turn_ends": 0,
        }
        assert t["trained_tokens"] == sum(expected["loss_mask"])
        assert t["decoded"] is True
        text = "".join(tok[4] for tok in t["tokens"])
        prompt = job["rows"][row]["responses_create_params"]["input"][-1]["content"]
        assert prompt in text and "<|im_start|>assistant" in text
        trained = "".join(tok[4] for tok in t["tokens"] if tok[1])
        assert "get_weather" in trained and "bring a jacket" in trained
        assert [c["call"] for c in t["calls"]] == [0, 1]


def test_compare_finds_the_flipped_tasks(viewer_url: str) -> None:
    status, r = get(f"{viewer_url}/api/compare?a=0&b=1")
    assert status == 200
    assert (r["common_tasks"], r["gained"], r["lost"]) == (5, 0, 1)
    assert r["mean_a"] == pytest.approx(1.0) and r["mean_b"] == pytest.approx(0.7)
    by_task = {t["task"]: t for t in r["tasks"]}
    assert by_task[0]["delta"] == pytest.approx(-1.0) and by_task[0]["flip"] == "lost"
    assert by_task[1]["delta"] == pytest.approx(-0.5) and by_task[1]["flip"] is None
    assert [t["task"] for t in r["tasks"]][:2] == [0, 1]  # biggest change first
    status, flipped = get(f"{viewer_url}/api/compare?a=0&b=1&show=flipped")
    assert [t["task"] for t in flipped["tasks"]] == [0]
    status, back = get(f"{viewer_url}/api/compare?a=1&b=0&show=gained")
    assert [t["task"] for t in back["tasks"]] == [0] and back["gained"] == 1
    status, body = get(f"{viewer_url}/api/compare?a=0&b=1&show=weird")
    assert status == 400 and "show" in body["error"]
    assert r["prompts_differ"] == 0 and r["warning"] is None  # the same input: nothing to warn of


def test_compare_warns_when_the_paired_tasks_have_different_prompts(tmp_path: Path) -> None:
    from nemo_gym.viewer.compare import compare

    def collection(name: str, prompts: list[str]) -> Collection:
        rows = [
            {
                "_ng_task_index": task,
                "_ng_rollout_index": 0,
                "reward": 1.0,
                "agent_ref": {"name": "agent"},
                "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
                "response": {"output": []},
            }
            for task, prompt in enumerate(prompts)
        ]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return Collection.open(path)

    a = collection("a", ["What is 2+2?", "Name a prime.", "Spell cat."])
    b = collection("b", ["What is 2+2?", "Name a colour.", "Spell dog."])  # the same indexes, other input
    r = compare(a, b)
    assert r["common_tasks"] == 3 and r["prompts_differ"] == 2
    assert "2 of the 3 tasks in both collections have different prompts" in r["warning"]
    by_task = {t["task"]: t for t in r["tasks"]}
    assert by_task[1]["prompt_b"] == "Name a colour." and by_task[0]["prompt_b"] is None
    assert compare(a, collection("c", ["What is 2+2?", "Name a prime.", "Spell cat."]))["warning"] is None


def test_page_and_assets_are_served(viewer_url: str) -> None:
    with urllib.request.urlopen(f"{viewer_url}/", timeout=10) as response:
        html = response.read().decode()
    assert (
        '<script src="/static/app.js">' in html and "http" not in html.split("<body>")[1].split("</body>")[0]
    )
    with urllib.request.urlopen(f"{viewer_url}/static/app.js", timeout=10) as response:
        assert "function overview" in response.read().decode()
    assert get(f"{viewer_url}/static/secret.txt")[0] == 404


# ---- files that change, side files, bad lines --------------------------------------------------
def test_index_is_saved_reused_and_rebuilt(job: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    shutil.copy(job["a"], path)
    first = RowIndex.open(path)
    assert len(first) == 10 and first.loaded_rows == 0
    assert (tmp_path / ("r.jsonl" + INDEX_SUFFIX)).is_file()
    again = RowIndex.open(path)
    assert again.loaded_rows == 10 and list(again.columns["offset"]) == list(first.columns["offset"])
    assert again.read_row(4) == job["rows"][4]
    # Rewritten with other rows: the saved index no longer matches and is rebuilt.
    rows = job["rows"][::-1]
    write_rows(path, rows)
    rebuilt = RowIndex.open(path)
    assert rebuilt.loaded_rows == 0 and rebuilt.read_row(0) == rows[0]


def test_growing_file_shows_progress_live(job: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    shutil.copy(
        job["a"].with_name("rollouts_materialized_inputs.jsonl"), tmp_path / "live_materialized_inputs.jsonl"
    )
    lines = job["a"].read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:4]))
    collection = Collection.open(path)
    with serving(Viewer([collection])) as url:
        assert get(f"{url}/api/collections")[1]["collections"][0]["rows"] == 4
        status, o = get(f"{url}/api/overview")
        assert (o["rows"], o["expected"], o["complete"]) == (4, 10, False)
        with path.open("ab") as sink:
            sink.write(b"".join(lines[4:7]) + lines[7][:50])  # row 7 is still being written
        time.sleep(0.6)
        status, o = get(f"{url}/api/overview")
        assert o["rows"] == 7 and o["num_tasks"] == len({r["_ng_task_index"] for r in job["rows"][:7]})
        assert collection.index.loaded_rows == 0 and not collection.index.rebuilt
        with path.open("ab") as sink:
            sink.write(lines[7][50:] + b"".join(lines[8:]))
        time.sleep(0.6)
        status, o = get(f"{url}/api/overview")
        assert (o["rows"], o["complete"]) == (10, True)
        assert get(f"{url}/api/rollout?row=7")[1]["data"] == job["rows"][7]
        first_task = get(f"{url}/api/tasks")[1]["tasks"][0]
        assert first_task["rows"] == [
            i for i, r in enumerate(job["rows"]) if r["_ng_task_index"] == first_task["task"]
        ]


def test_failures_sidecar_and_bad_lines(job: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    lines = job["a"].read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:6]) + b"{not json\n" + b"[1, 2]\n")
    failures = [
        {"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_failure_class": "agent_timeout", "_ng_error": "x"},
        {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_failure_class": "agent_timeout", "_ng_error": "x"},
        {"_ng_task_index": 4, "_ng_rollout_index": 0, "_ng_failure_class": "upstream_5xx", "_ng_error": "y"},
    ]
    write_rows(tmp_path / "f_failures.jsonl", failures)
    with serving(Viewer([Collection.open(path)])) as url:
        status, o = get(f"{url}/api/overview")
        assert o["failures_by_class"] == {"agent_timeout": 2, "upstream_5xx": 1} and o["failures"] == 3
        assert o["rows"] == 8 and o["bad_lines"] == 2
        assert o["failure_samples"][2] == {"task": 4, "rollout": 0, "class": "upstream_5xx", "error": "y"}
        status, t = get(f"{url}/api/tasks?status=failed")
        assert [(task["task"], task["failures"]) for task in t["tasks"]] == [(3, 2), (4, 1)]
        status, bad = get(f"{url}/api/rollout?row=6")
        assert status == 200 and bad["data"]["_ng_viewer_bad_line"] == "{not json\n"
        status, tokens = get(f"{url}/api/tokens?row=7")
        assert status == 200 and tokens["available"] is False and "no 'response'" in tokens["reason"]
        assert bad["data"]["error"]


def test_rollout_without_token_ids_says_why(job: dict[str, Any], tmp_path: Path) -> None:
    rows = job["rows"][:2]
    for item in rows[0]["response"]["output"]:
        for name in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
            item.pop(name, None)
    path = tmp_path / "plain.jsonl"
    write_rows(path, rows)
    with serving(Viewer([Collection.open(path)])) as url:
        status, t = get(f"{url}/api/tokens?row=0")
        assert status == 200 and t["available"] is False
        assert "carries no token IDs" in t["reason"] and "return_token_id_information" in t["reason"]
        assert get(f"{url}/api/tokens?row=1")[1]["available"] is True


def test_auth_token_rules(job: dict[str, Any]) -> None:
    with serving(Viewer([Collection.open(job["a"])]), token="s3cret") as url:
        status, body = get(f"{url}/api/overview")
        assert status == 401 and "auth token" in body["error"]
        assert get(f"{url}/api/overview", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(f"{url}/api/overview", {"Authorization": "Bearer s3cret"})[0] == 200
        assert get(f"{url}/?token=wrong")[0] == 401

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as redirect:
            opener.open(f"{url}/?token=s3cret", timeout=10)
        assert redirect.value.code == 303 and redirect.value.headers["Location"] == "/"
        cookie = redirect.value.headers["Set-Cookie"]
        assert cookie.startswith(f"{TOKEN_COOKIE}=s3cret") and "HttpOnly" in cookie
        assert get(f"{url}/api/overview", {"Cookie": f"{TOKEN_COOKIE}=s3cret"})[0] == 200
        assert get(f"{url}/api/overview", {"Cookie": f"{TOKEN_COOKIE}=nope"})[0] == 401


def test_ng_viewer_rejects_a_missing_input(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym.viewer.app", f"+input={tmp_path / 'missing.jsonl'}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "missing.jsonl is not a file" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym.viewer.app"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "+input=" in done.stderr


def test_ng_viewer_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym.viewer.app", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "+input=" in done.stdout and "+tokenizer" in done.stdout


def test_parallel_index_build_matches_serial(
    job: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_gym.viewer import index as index_module

    rows: list[Any] = []
    for copy in range(6):
        for row in job["rows"]:
            row = dict(row, agent_ref={"type": "responses_api_agents", "name": f"agent{copy % 3}"})
            if copy % 2:
                row.pop("_ng_task_index")  # each such row is its own task, keyed by its row number
            rows.append(row)
    path = tmp_path / "p.jsonl"
    write_rows(path, rows)
    with path.open("ab") as sink:
        sink.write(b"not json\n\n" + json.dumps(rows[0]).encode()[:40])  # a bad line, a blank, a partial row
    serial = RowIndex(path, tmp_path / "serial.ngindex")
    serial.refresh(force=True)
    monkeypatch.setattr(index_module, "_PARALLEL_BYTES", 0)
    monkeypatch.setattr(index_module.os, "cpu_count", lambda: 4)
    parallel = RowIndex(path, tmp_path / "parallel.ngindex")
    parallel.refresh(force=True)
    assert len(serial) == len(parallel) == len(rows) + 1
    for name in serial.columns:
        assert parallel.columns[name].tobytes() == serial.columns[name].tobytes(), name
    assert parallel.agents == serial.agents and parallel.snippets == serial.snippets
    assert parallel.indexed_bytes == serial.indexed_bytes < path.stat().st_size
    assert -1 - 10 in parallel.snippets  # row 10 has no task index: its own task
    assert parallel.read_row(len(rows))["_ng_viewer_bad_line"] == "not json\n"


def test_a_rewritten_file_is_summarized_again(job: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    write_rows(path, job["rows"])
    collection = Collection.open(path)
    assert len(collection.tasks_by_key) == 5 and collection.overview()["mean_reward"] == pytest.approx(1.0)
    rows = [dict(row, reward=0.0) for row in job["rows"] if row["_ng_task_index"] < 2]
    write_rows(path, rows)  # a new collection written over the old one
    collection.refresh()
    assert collection.index.loaded_rows == 0 and len(collection.index) == 4
    overview = collection.overview()
    assert (overview["rows"], overview["num_tasks"], overview["mean_reward"]) == (4, 2, 0.0)
    assert overview["agents"][0]["solved_never"] == 2
    assert [task["rows"] for task in collection.tasks()["tasks"]] == [
        [i for i, r in enumerate(rows) if r["_ng_task_index"] == t] for t in (0, 1)
    ]
