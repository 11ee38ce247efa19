"""code_gen: extraction, comparison, both test modes, adversarial programs, NeMo Gym replay, e2e."""

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    read_jsonl,
    replay_recorded,
    running_server,
    verify_text,
)
from resources_servers.code_gen.app import CodeGenServer
from resources_servers.code_gen.judge import compare_stdout, extract_python_code
from resources_servers.code_gen.sandbox import CodeSandbox, RunStatus, SandboxLimits

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("code_gen")
ROWS = {r["hash_id"]: r for r in read_jsonl(HERE / "data" / "example.jsonl")}
SUMS, REVERSE, DISTINCT, GAP, WINDOW = ROWS.values()
SUMS_CODE = "import sys\nd = sys.stdin.read().split()\nprint('\\n'.join(str(int(d[1+2*i]) + int(d[2+2*i])) for i in range(int(d[0]))))"
GAP_CODE = (
    "class Solution:\n    def max_gap(self, nums):\n        nums = sorted(nums)\n"
    "        return max((b - a for a, b in zip(nums, nums[1:])), default=0)\n"
)


def fenced(code: str) -> str:
    return f"Here is my program.\n\n```python\n{code}\n```\n"


def probe_layers() -> dict:
    return asyncio.run(CodeSandbox(max_concurrency=1).probe())


LAYERS = probe_layers()
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def work_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandbox_work")


@pytest.fixture(scope="module")
def url(work_root: Path):
    config = {
        "name": "code_gen",
        "num_processes": 2,
        "unit_test_timeout_secs": 1,
        # Room for the CPU limit to be reached first on a loaded machine: a wall-clock timeout
        # spent waiting for a CPU is a verifier_timeout failure, not the program's time limit.
        "wall_time_limit_secs": 20,
        "memory_limit_mb": 512,
        "max_output_mb": 1,
        "sandbox_work_root": str(work_root),
    }
    with running_server(CodeGenServer(config)) as base:
        yield base


def test_the_last_python_block_is_extracted():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert extract_python_code(text) == "print(2)"
    assert extract_python_code("```\nprint(3)\n```") == "print(3)"  # untagged, when nothing is tagged
    assert extract_python_code("```python\nprint(1)\n```\n```\nprint(3)\n```") == "print(1)"
    assert extract_python_code("```python\nprint(4)\n") is None  # never closed (truncated answer)
    assert extract_python_code("print(5)") is None
    assert extract_python_code("```python\n   \n```") is None


def test_stdout_comparison_ignores_surrounding_whitespace_and_compares_numbers():
    assert compare_stdout("1 2 \n3\n\n", "1 2\n3") == (True, "")
    assert compare_stdout("1.0 2.50\n", "1 2.5\n")[0]
    assert compare_stdout("1\n2\n", "1\n\n2\n") == (False, "Wrong answer: mismatched output length")
    assert compare_stdout("-1\n", "1\n") == (False, "Wrong answer at output_line_idx=0: -1 != 1")
    assert not compare_stdout("abc\n", "abd\n")[0]


def test_correct_programs_score_one_in_both_modes(url: str):
    body = verify_text(url, SUMS, fenced(SUMS_CODE))
    assert (body["reward"], body["result"]) == (1.0, [True, True, True])
    assert body["extracted_model_code"] == SUMS_CODE
    assert body["reason"] == "all 3 tests passed"
    body = verify_text(url, GAP, fenced(GAP_CODE))
    assert (body["reward"], body["result"]) == (1.0, [True] * 4)
    assert body["hash_id"] == "cg-ex-0004"  # row fields pass through


def test_wrong_answers_score_zero_with_the_first_failure(url: str):
    body = verify_text(url, DISTINCT, fenced("input()\nprint(len(input().split()))"))
    assert body["reward"] == 0.0
    assert body["result"] == [-2]
    assert body["metadata"]["error_message"] == "Wrong answer at output_line_idx=0: 5 != 3"
    assert body["metadata"]["expected"] == "3\n"
    assert body["reason"].startswith("test 1/4 failed")
    wrong_gap = "class Solution:\n    def max_gap(self, nums):\n        return len(nums)\n"
    body = verify_text(url, GAP, fenced(wrong_gap))
    assert (body["reward"], body["result"]) == (0.0, [-2])
    assert body["metadata"]["error_message"] == "Wrong answer: 4 != 3"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "the response has no answer text"),
        ("print(1)", "no ```python code block in the answer"),
        ("```python\nprint(1)", "no ```python code block in the answer"),
    ],
)
def test_answers_without_a_program_score_zero(url: str, text: str, reason: str):
    body = verify_text(url, SUMS, text)
    assert (body["reward"], body["reason"]) == (0.0, reason)


def test_an_empty_response_scores_zero(url: str):
    body = verify_text(url, SUMS, None)
    assert (body["reward"], body["reason"]) == (0.0, "the response has no answer text")


@pytest.mark.parametrize(
    ("code", "error_code", "reason_part"),
    [
        ("def broken(:\n    pass", -1, "compile error: SyntaxError"),
        ("raise ValueError('boom')", -4, "ValueError: boom"),
        ("import sys\nsys.exit(3)", -4, "SystemExit(3)"),
        ("class Solution:\n    pass", -4, "function 'max_gap' not found"),
        ("class Solution:\n    def max_gap(self, nums):\n        return {1, 2}", -4, "not JSON-serializable"),
    ],
)
def test_broken_programs_score_zero_with_the_reason(url: str, code: str, error_code: int, reason_part: str):
    row = GAP if "Solution" in code else SUMS
    body = verify_text(url, row, fenced(code))
    assert body["reward"] == 0.0
    assert body["result"] == [error_code]
    assert reason_part in body["reason"]


def test_bad_rows_get_422_naming_the_field(url: str):
    body = verify_text(url, {"responses_create_params": {}}, fenced("print(1)"), status=422)
    assert "verifier_metadata.unit_tests" in str(body)
    mismatched = {**SUMS, "verifier_metadata": {"unit_tests": {"inputs": ["1\n"], "outputs": []}}}
    body = verify_text(url, mismatched, fenced("print(1)"), status=422)
    assert "1 inputs but 0 outputs" in str(body)
    packed_badly = {**SUMS, "verifier_metadata": {"unit_tests": {"packed": "%%%"}}}
    assert "packed" in str(verify_text(url, packed_badly, fenced("print(1)"), status=422))


def _adversarial_cases(tmp_dir: Path, port: int) -> list[tuple[str, str, int, str]]:
    outside = tmp_dir / "escaped.txt"
    return [
        ("infinite loop", "while True:\n    pass", -3, "time limit exceeded"),
        ("10 GB allocation", "x = bytearray(10 * 1024 ** 3)\nprint(len(x))", -4, "MemoryError"),
        (
            "socket to the server itself",
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
            -4,
            "runtime error",
        ),
        (
            "write outside the working directory",
            f"open({str(outside)!r}, 'w').write('x')",
            -4,
            "PermissionError",
        ),
        ("output flood", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", -4, "output exceeded"),
        ("signal the server", "import os\nos.kill(os.getppid(), 0)\nprint('reached')", -4, "PermissionError"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_adversarial_programs_are_contained_and_the_server_keeps_answering(
    url: str, tmp_path: Path, case: int
):
    if not LAYERS.get("landlock_abi") and case == 3:
        pytest.skip("Landlock is not available here: writes outside the working directory cannot be blocked")
    if not (LAYERS.get("seccomp") or LAYERS.get("landlock_abi", 0) >= 6) and case == 5:
        pytest.skip("neither seccomp nor Landlock signal scoping is available here")
    port = int(url.rsplit(":", 1)[1])
    name, code, error_code, reason_part = _adversarial_cases(tmp_path, port)[case]
    body = verify_text(url, SUMS, fenced(code))
    assert body["reward"] == 0.0, name
    assert body["result"] == [error_code], (name, body["metadata"])
    assert reason_part in body["reason"], (name, body["reason"])
    assert "connected" not in body["metadata"]["output"] and "reached" not in body["metadata"]["output"]
    assert not (tmp_path / "escaped.txt").exists()
    assert verify_text(url, SUMS, fenced(SUMS_CODE))["reward"] == 1.0  # and the next request is served


def test_a_fork_bomb_is_contained(url: str):
    if not LAYERS.get("seccomp") and IS_ROOT:
        pytest.skip("no seccomp and running as root: RLIMIT_NPROC does not bind root, not safe to run here")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    body = verify_text(url, SUMS, fenced(bomb))
    assert (body["reward"], body["result"]) == (0.0, [-3])
    # Only this process's descendants and orphans count: other test runs may share the machine.
    mine = psutil.Process().children(recursive=True)
    assert len(mine) < 20
    children = [
        p
        for p in psutil.process_iter(["cmdline", "ppid"])
        if "sandbox/isolation/child.py" in " ".join(p.info["cmdline"] or [])
    ]
    assert not [p for p in children if p in mine or p.info["ppid"] == 1]
    assert verify_text(url, SUMS, fenced(SUMS_CODE))["reward"] == 1.0


def test_files_outside_the_working_directory_cannot_be_read(url: str, tmp_path: Path):
    if not LAYERS.get("landlock_abi"):
        pytest.skip("Landlock is not available here")
    secret = tmp_path / "answers.txt"
    secret.write_text("the expected outputs")
    body = verify_text(url, SUMS, fenced(f"print(open({str(secret)!r}).read())"))
    assert (body["reward"], body["result"]) == (0.0, [-4])
    assert "PermissionError" in body["reason"]


def test_the_child_gets_an_empty_environment_and_a_fresh_directory_that_is_removed(
    url: str, work_root: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("NG_TEST_SECRET_TOKEN", "do-not-leak")
    code = "import os\nprint(sorted(k for k in os.environ if k != 'LC_CTYPE'), sorted(os.listdir('.')))"
    row = {
        **SUMS,
        "verifier_metadata": {"unit_tests": {"inputs": [""], "outputs": ["[] ['.stdin', 'solution.py']"]}},
    }
    body = verify_text(url, row, fenced(code))
    assert body["reward"] == 1.0, body["metadata"]
    assert list(work_root.iterdir()) == []


def test_the_event_loop_stays_free_while_tests_run(url: str):
    row = {**SUMS, "verifier_metadata": {"unit_tests": {"inputs": ["", ""], "outputs": ["1", "1"]}}}
    finished: list[dict] = []
    worker = threading.Thread(
        target=lambda: finished.append(
            verify_text(url, row, fenced("import time\ntime.sleep(1.5)\nprint(1)"))
        )
    )
    worker.start()
    time.sleep(0.3)
    with SyncClient() as client:
        started = time.monotonic()
        status, _ = client.get(url + "/")
        latency = time.monotonic() - started
    worker.join(20)
    assert status == 200 and latency < 0.5
    assert finished and finished[0]["reward"] == 1.0


async def test_test_cases_run_concurrently_up_to_the_limit():
    sandbox = CodeSandbox(SandboxLimits(cpu_time_s=2, wall_time_s=10), max_concurrency=2)
    started = time.monotonic()
    results = await asyncio.gather(
        *(sandbox.run("import time\ntime.sleep(0.8)\nprint('ok')") for _ in range(4))
    )
    elapsed = time.monotonic() - started
    assert [r.stdout for r in results] == ["ok\n"] * 4
    assert 1.6 <= elapsed < 3.1  # two at a time: two rounds, not one (unbounded) nor four (serial)


async def test_the_sandbox_reports_its_layers():
    layers = await CodeSandbox(max_concurrency=1).probe()
    assert layers["rlimits"] is True
    if sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64"):
        assert layers["seccomp"] is True
    result = await CodeSandbox(max_concurrency=1, require=["no_such_layer"]).run("print(1)")
    assert result.status is RunStatus.SANDBOX_FAILURE
    assert "no_such_layer" in result.message


@pytest.mark.slow  # one row has 82 test cases
@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rows_run_unchanged_and_replay_their_rewards(url: str):
    # NeMo Gym's rollout rows dropped verifier_metadata: join them with their source row.
    replayed = replay_recorded(
        url,
        COMPAT,
        lambda recorded, source: {**recorded, "verifier_metadata": source["verifier_metadata"]},
        timeout_s=120,
    )
    assert len(replayed) == 5
    for recorded, ours in replayed:
        assert ours["reward"] == recorded["reward"]
        assert ours["result"] == recorded["result"]
        assert ours["extracted_model_code"] == recorded["extracted_model_code"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl")
    assert (summary.succeeded, summary.failed) == (5, 0)
    rewards = {r["hash_id"]: r["reward"] for r in rows}
    assert rewards == {
        "cg-ex-0001": 1.0,
        "cg-ex-0002": 1.0,
        "cg-ex-0003": 0.0,
        "cg-ex-0004": 1.0,
        "cg-ex-0005": 0.0,
    }


async def test_without_seccomp_or_a_network_namespace_python_sockets_are_blocked():
    sandbox = CodeSandbox(SandboxLimits(cpu_time_s=2), 1, use_netns=False, use_seccomp=False)
    layers = await sandbox.probe()
    assert (layers["seccomp"], layers["netns"], layers["python_socket_block"]) == (False, False, True)
    result = await sandbox.run("import socket\nsocket.socket()")
    assert result.status is RunStatus.RUNTIME_ERROR
    assert "network access is disabled" in result.message
