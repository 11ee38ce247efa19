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

from nemo_gym.collection.collection_io import CollectionPaths
from nemo_gym.collection.output_lock import OutputLockedError, lock_path, output_lock
from nemo_gym.launch.config import project_root
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
            "import sys, time; from pathlib import Path; from nemo_gym.collection.output_lock import output_lock\n"
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


def test_a_line_300_levels_deep_is_a_failure_row_and_refused_with_strict(tmp_path: Path):
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
    assert "100.0% of what this run tried failed (malformed input lines: 2)" in done.stderr
    assert "max_failure_ratio=0.1" in done.stderr
    # One instruction, which names the lines to fix.
    assert done.stderr.count("Next:") == 1 and f"fix input lines 1, 2 of {source}" in done.stderr
    assert "+resume_from_cache=true" in done.stderr and "collect again" not in done.stdout + done.stderr

    strict = collector(
        f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={tmp_path / 'y.jsonl'}", "+strict=true"
    )
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


def _under_a_file(tmp: Path, *parts: str) -> Path:
    (tmp / "plain").write_text("x")
    return tmp.joinpath("plain", *parts)


def _a_directory(tmp: Path) -> Path:
    (tmp / "adir").mkdir()
    return tmp / "adir"


@pytest.mark.parametrize(
    "make_output, named",
    [
        (lambda tmp: _under_a_file(tmp, "x.jsonl"), "is a file, not a directory"),
        (lambda tmp: _under_a_file(tmp, "sub", "x.jsonl"), "is a file, not a directory"),
        (_a_directory, "is a directory"),
    ],
)
def test_an_output_path_mistake_is_one_line_naming_the_path(tmp_path: Path, make_output, named: str):
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(GOOD) + b"\n")
    out = make_output(tmp_path)
    done = collector(f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={out}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and named in done.stderr and str(out) in done.stderr
    assert (
        done.stderr.startswith("config error: ") and len(done.stderr.strip().splitlines()) == 2
    )  # + the --help hint


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any directory")
def test_an_unwritable_output_directory_is_one_line(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(GOOD) + b"\n")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        done = collector(f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={locked / 'x.jsonl'}")
    finally:
        locked.chmod(0o700)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{locked} is not writable" in done.stderr


def test_a_run_leaves_no_lock_and_a_failed_first_check_leaves_no_materialized_inputs(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(GOOD) + b"\n")
    out = tmp_path / "x.jsonl"
    # No head server at the collector's head URL: the run stops at its first check (the agent).
    done = collector(f"+input_jsonl_fpath={source}", f"+output_jsonl_fpath={out}")
    assert done.returncode == 2 and "cannot reach the head server" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    # A run that finishes (every line malformed, nothing to send) leaves no lock either.
    source.write_bytes(b"{not json\n")
    done = collector(
        f"+input_jsonl_fpath={source}",
        f"+output_jsonl_fpath={out}",
        "+strict=false",
        "+max_failure_ratio=1.0",
        "+disable_aggregation=true",
    )
    assert done.returncode == 0, done.stderr
    assert not lock_path(out).exists() and not list(tmp_path.glob("*.lock"))


def test_a_collector_that_opened_a_removed_lock_file_opens_the_path_again(tmp_path: Path):
    out = tmp_path / "x.jsonl"
    with output_lock(out) as path:
        stale = os.open(path, os.O_RDWR)  # a second process opened the file, then waited
    assert not path.exists()
    try:
        with output_lock(out) as again:  # a fresh file: the lock is on what the path names
            assert again.exists() and os.fstat(stale).st_ino != again.stat().st_ino
    finally:
        os.close(stale)
