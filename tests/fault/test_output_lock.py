"""The collector's output file: one collector at a time, duplicates dropped on resume, bad lines
(300 levels deep included) as failure rows, and a non-zero exit above the failure ratio.

The collector runs as a real ``ng_collect_rollouts`` process where its exit status matters.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from nemo_gym.collection_io import CollectionPaths
from nemo_gym.config import project_root
from nemo_gym.output_lock import OutputLockedError, lock_path, output_lock
from nemo_gym.rollout_collection import (
    EXIT_TOO_MANY_FAILURES,
    CollectionSummary,
    RolloutCollectionHelper,
    failure_exit_code,
)
from nemo_gym.testing import read_jsonl

GOOD = {
    "responses_create_params": {"input": "2+2?"},
    "agent_ref": {"type": "responses_api_agents", "name": "a"},
}


def collector(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEMO_GYM_HEAD_URL": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, "-m", "nemo_gym.rollout_collection", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=project_root(),
        env=env,
    )


def nested_line(depth: int) -> bytes:
    return b'{"responses_create_params": {"input": "x"}, "deep": ' + b"[" * depth + b"]" * depth + b"}"


def test_a_second_collector_on_a_locked_output_exits_with_a_clear_message(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(GOOD) + b"\n")
    out = tmp_path / "x.jsonl"
    with output_lock(out):
        done = collector(f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={out}")
        assert done.returncode == 2, done.stderr
        assert "being written by another collector" in done.stderr and f"pid {os.getpid()}" in done.stderr
        assert "Traceback" not in done.stderr
        assert not out.exists() and not CollectionPaths.for_output(out).failures.exists()
        with pytest.raises(OutputLockedError):  # in-process as well (a second helper, same file)
            with output_lock(out):
                pass


def test_the_lock_of_a_killed_collector_is_released(tmp_path: Path):
    out = tmp_path / "x.jsonl"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from nemo_gym.output_lock import output_lock\n"
            "with output_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=project_root(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLockedError, match=f"pid {holder.pid}"):
            with output_lock(out):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 5
        while True:
            try:
                with output_lock(out) as path:
                    assert path == lock_path(out)
                break
            except OutputLockedError:
                assert time.monotonic() < deadline, "the lock outlived its holder"
                time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait(10)


def test_a_resume_that_finds_duplicates_keeps_one_of_each(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({**GOOD, "i": i}) + b"\n" for i in range(3)))
    out = tmp_path / "x.jsonl"
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": 0, "reward": 1.0, "copy": c}
        for c in range(3)
        for t in range(3)
    ]
    out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    summary = asyncio.run(
        RolloutCollectionHelper().run_from_config(
            {
                "input_jsonl_fpath": str(source),
                "output_jsonl_fpath": str(out),
                "resume_from_cache": True,
                "disable_aggregation": True,
            },
            verbose=False,
        )
    )
    kept = read_jsonl(out)
    assert [(r["_ng_task_index"], r["copy"]) for r in kept] == [(0, 0), (1, 0), (2, 0)]
    assert summary.results_in_file == 3 and summary.already_done == 3 and summary.dispatched == 0


def test_a_line_300_levels_deep_is_a_failure_row_even_without_strict(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(nested_line(299) + b"\n" + b"{not json\n")  # 300 levels with the outer object
    out = tmp_path / "x.jsonl"
    done = collector(
        f"+input_jsonl_fpath={source}",
        f"+output_jsonl_fpath={out}",
        "+strict=false",
        "+disable_aggregation=true",
    )
    assert "Traceback" not in done.stderr, done.stderr
    failures = read_jsonl(CollectionPaths.for_output(out).failures)
    assert [f["_ng_failure_class"] for f in failures] == ["malformed_input", "malformed_input"]
    assert "nested 300 levels deep" in orjson.dumps(failures[0]).decode()
    # Every line failed: above the default ratio, so a non-zero exit with the summary.
    assert done.returncode == EXIT_TOO_MANY_FAILURES, done.stderr
    assert "100.0% of the rollouts failed" in done.stderr and "max_failure_ratio=0.1" in done.stderr

    strict = collector(f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={tmp_path / 'y.jsonl'}")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "nested 300 levels deep" in strict.stderr


def test_the_failure_ratio_is_configurable(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"{not json\n")
    done = collector(
        f"+input_jsonl_fpath={source}",
        f"+output_jsonl_fpath={tmp_path / 'x.jsonl'}",
        "+strict=false",
        "+disable_aggregation=true",
        "+max_failure_ratio=1.0",
    )
    assert done.returncode == 0, done.stderr
    paths = CollectionPaths.for_output(tmp_path / "x.jsonl")
    summary = CollectionSummary(paths, succeeded=9, failed=1)
    assert failure_exit_code(summary, 0.1) == 0  # exactly at the ratio passes
    summary.failed = 2
    assert failure_exit_code(summary, 0.1) == EXIT_TOO_MANY_FAILURES
    assert failure_exit_code(CollectionSummary(paths), 0.0) == 0  # nothing ran
