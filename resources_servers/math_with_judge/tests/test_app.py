"""math_with_judge: symbolic checks, the per-check CPU budget (used up by the answer: a 0 with the
reason; the machine's wall-clock backstop or a dead worker: a failure, not a 0),
the judge fallback (a real scripted judge server), NeMo Gym replay against ``library_reward``
with the default limits, and one collection end to end."""

import asyncio
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from nemo_gym.response_items import message_item
from nemo_gym.serving.server_client import ServerClient
from nemo_gym.testing import (
    collect_examples,
    compat_dir,
    read_jsonl,
    replay_recorded,
    running_server,
    verify_text,
)
from resources_servers.math_with_judge.app import MathWithJudgeServer, last_boxed
from responses_api_models.scripted_model.app import ScriptedModel

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("math_with_judge")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
PRODUCT, FRACTION, ROOT, HEXAGON, INTEGRAL = ROWS
PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"  # math-verify grinds on this for seconds
JUDGE_REF = {"type": "responses_api_models", "name": "judge"}
WORDS_ROW = {**PRODUCT, "question": "How many legs does a bird have?", "expected_answer": "two"}
JUDGE_SCRIPTS = [
    {"match": "(?s)legs does a bird.*ANSWER A:\ntwo\n", "turns": [{"text": "Both are 2.\n[[A=B]]"}]},
    {"match": "(?s)legs does a bird.*ANSWER B:\ntwo\n", "turns": [{"text": "Same number.\n[[A=B]]"}]},
    {"match": "(?s)legs of a spider", "turns": [{"text": "Eight is not two.\n[[A!=B]]"}]},
    {"match": "(?s)legs of an ant", "turns": [{"text": "Hard to say."}]},
    {"match": None, "turns": [{"text": "[[A!=B]]"}]},
]


def make_server(**config: Any) -> MathWithJudgeServer:
    base = {"name": "math_with_judge", "library_verifier_max_concurrency": 2}
    return MathWithJudgeServer({**base, **config})


@pytest.fixture(scope="module")
def symbolic():
    # The default limits: one NeMo Gym row takes 3-4 CPU seconds of SymPy, inside the budget.
    server = make_server()
    with running_server(server) as base:
        yield server, base


@pytest.fixture(scope="module")
def url(symbolic: tuple[MathWithJudgeServer, str]) -> str:
    return symbolic[1]


@pytest.fixture(scope="module")
def judge_url():
    with running_server(ScriptedModel({"name": "judge", "scripts": JUDGE_SCRIPTS})) as base:
        yield base


def judged_server(judge_base: str, **config: Any) -> MathWithJudgeServer:
    client = ServerClient(static_urls={"judge": judge_base}, connect_retries=1, timeout_s=10)
    return MathWithJudgeServer(
        {
            "name": "math_with_judge",
            "library_verifier_max_concurrency": 1,
            "library_verifier_timeout_seconds": 60,
            "judge_model_server": JUDGE_REF,
            **config,
        },
        server_client=client,
    )


@pytest.fixture(scope="module")
def judged_url(judge_url: str):
    with running_server(judged_server(judge_url)) as base:
        yield base


def verify(url: str, row: dict, text: str | None, status: int = 200) -> dict:
    return verify_text(url, row, text, status, timeout_s=180)


def test_equivalent_answers_score_one(url: str):
    body = verify(url, PRODUCT, "17 * 23 = \\boxed{391}")
    assert (body["reward"], body["library_reward"], body["library_reason"]) == (1.0, 1.0, "equivalent")
    assert body["extracted_answer"] == "391" and body["judge_evaluations"] is None
    assert verify(url, FRACTION, "\\boxed{\\dfrac{10}{12}}")["reward"] == 1.0
    assert verify(url, ROOT, "\\boxed{2^{1/2}}")["reward"] == 1.0
    assert verify(url, HEXAGON, "\\boxed{720^\\circ}")["reward"] == 1.0


def test_wrong_answer_scores_zero(url: str):
    body = verify(url, PRODUCT, "\\boxed{392}")
    assert (body["reward"], body["library_reason"], body["extracted_answer"]) == (
        0.0,
        "not_equivalent",
        "392",
    )


def test_the_last_box_wins_and_a_final_answer_without_a_box_counts(url: str):
    assert verify(url, PRODUCT, "First \\boxed{392}, corrected: \\boxed{391}")["reward"] == 1.0
    assert verify(url, PRODUCT, "\\boxed{391}? No: \\boxed{392}")["reward"] == 0.0
    assert verify(url, INTEGRAL, "The integral is 1")["reward"] == 1.0
    assert last_boxed("\\boxed{\\frac{1}{2}} then \\boxed{oops") == "\\frac{1}{2}"


def test_empty_and_malformed_answers_score_zero(url: str):
    for text in (None, "", "  ", "\\boxed{}", "\\boxed{ }"):
        body = verify(url, PRODUCT, text)
        assert (body["reward"], body["library_reason"], body["extracted_answer"]) == (0.0, "no_answer", None)
    assert verify(url, PRODUCT, "\\boxed{3}91}")["reward"] == 0.0
    assert verify(url, PRODUCT, "I don't know.")["reward"] == 0.0


def test_a_row_without_expected_answer_gets_422(url: str):
    row = {k: v for k, v in PRODUCT.items() if k != "expected_answer"}
    body = verify(url, row, "\\boxed{391}", status=422)
    assert body["detail"][0]["field"] == "expected_answer"


def test_a_pathological_expression_scores_zero_for_its_cpu_budget_while_the_server_keeps_answering():
    server = make_server(library_verifier_timeout_seconds=1)
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0  # workers are up
        pids_before = set(server.pool.worker_pids)

        async def scenario() -> tuple[dict, float, float, dict, float]:
            async with aiohttp.ClientSession() as http:

                async def post(text: str, status: int = 200) -> dict:
                    payload = {**PRODUCT, "response": {"output": [message_item(text)]}}
                    async with http.post(base + "/verify", json=payload) as resp:
                        assert resp.status == status
                        return await resp.json()

                started = time.monotonic()
                slow = asyncio.create_task(post(PATHOLOGICAL))
                await asyncio.sleep(0.3)
                probe = time.monotonic()
                async with http.get(base + "/") as resp:
                    assert resp.status == 200
                liveness_s = time.monotonic() - probe
                quick = await post("\\boxed{391}")  # the other worker answers meanwhile
                quick_done = time.monotonic() - started
                result = await slow
                return result, time.monotonic() - started, liveness_s, quick, quick_done

        result, elapsed, liveness_s, quick, quick_done = asyncio.run(scenario())
        # Out of CPU time: the answer's own doing (a CPU budget holds however busy the machine
        # is), so a verdict of 0 with the reason, returned promptly, as NeMo Gym does.
        assert (result["reward"], result["library_reason"]) == (0.0, "cpu_budget_exhausted")
        assert 0.9 <= elapsed < 10
        assert liveness_s < 1.0 and quick["reward"] == 1.0 and quick_done < elapsed
        # The overrunning worker was killed and replaced; checks keep working afterwards.
        assert server.pool.replaced == 1
        deadline = time.monotonic() + 30
        while len(server.pool.worker_pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids_after = set(server.pool.worker_pids)
        assert len(pids_after) == 2 and pids_after != pids_before
        for pid in pids_before - pids_after:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert verify(base, FRACTION, "\\boxed{5/6}")["reward"] == 1.0
    assert server.pool.worker_pids == []  # stopping the server killed the workers


def test_nemo_gyms_pathological_sympy_expression_returns_promptly_with_a_reward():
    """NeMo Gym's ``test_library_verifier_returns_promptly_for_pathological_sympy_expression``:
    (x^800 - 1)/(x - 1) minus its 800 terms, against 0, with a 1 CPU-second budget."""
    terms = "+".join("1" if exponent == 0 else f"x^{exponent}" for exponent in range(800))
    answer = "\\boxed{\\frac{x^{800}-1}{x-1}-(" + terms + ")}"
    server = make_server(library_verifier_timeout_seconds=1, library_verifier_max_concurrency=1)
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0  # the worker is up
        started = time.monotonic()
        body = verify(base, {**PRODUCT, "expected_answer": "0"}, answer)
        assert time.monotonic() - started < 10
        assert body["reward"] in (0.0, 1.0) and body["library_reward"] == body["reward"]
        assert body["library_reason"] in ("equivalent", "not_equivalent", "cpu_budget_exhausted")


def test_the_machine_stalling_or_killing_a_worker_is_a_failure_not_a_zero():
    """A worker stopped past the wall-clock backstop (a machine loaded far past its cores), or
    killed from outside mid-check: the answer may well be right, so no reward is given."""
    server = make_server(
        library_verifier_timeout_seconds=5,
        library_verifier_wall_timeout_seconds=1,
        library_verifier_max_concurrency=1,
    )
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0
        (worker,) = server.pool.worker_pids
        os.kill(worker, signal.SIGSTOP)
        body = verify(base, FRACTION, "\\boxed{5/6}", status=504)
        assert body["failure_class"] == "verifier_timeout" and "reward" not in body
    server = make_server(library_verifier_timeout_seconds=30, library_verifier_max_concurrency=1)
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0
        (worker,) = server.pool.worker_pids
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(verify, base, PRODUCT, PATHOLOGICAL, 502)
            time.sleep(0.5)  # the worker is grinding on it
            os.kill(worker, signal.SIGKILL)
            body = pending.result(timeout=30)
        assert body["failure_class"] == "verifier_error" and "worker died" in body["error"]


def test_a_check_that_gets_no_cpu_for_a_while_still_finishes_with_its_verdict():
    """The budget is CPU time: a check starved of CPU (here: its worker stopped for 2.5 s, as on
    a machine loaded far past its cores) takes longer but keeps its verdict; under the old
    wall-clock limit of 1 s it would have been cut off and scored 0."""
    server = make_server(library_verifier_timeout_seconds=1, library_verifier_max_concurrency=1)
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0  # the worker is up
        (worker,) = server.pool.worker_pids
        os.kill(worker, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(verify, base, FRACTION, "\\boxed{\\dfrac{10}{12}}")
                time.sleep(2.5)
                os.kill(worker, signal.SIGCONT)
                body = pending.result(timeout=60)
        finally:
            os.kill(worker, signal.SIGCONT)
        assert time.monotonic() - started >= 2.5
        assert (body["reward"], body["library_reason"]) == (1.0, "equivalent")


def test_the_wall_clock_backstop_is_a_verifier_timeout_too():
    server = make_server(
        library_verifier_timeout_seconds=60,
        library_verifier_wall_timeout_seconds=1,
        library_verifier_max_concurrency=1,
    )
    with running_server(server) as base:
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0
        os.kill(server.pool.worker_pids[0], signal.SIGSTOP)  # a worker that makes no progress
        body = verify(base, PRODUCT, "\\boxed{391}", status=504)
        assert body["failure_class"] == "verifier_timeout" and "1s of wall time" in body["error"]
        assert verify(base, PRODUCT, "\\boxed{391}")["reward"] == 1.0  # replaced


def test_a_worker_killed_while_idle_is_replaced_without_failing_a_check(
    symbolic: tuple[MathWithJudgeServer, str],
):
    server, url = symbolic
    assert verify(url, PRODUCT, "\\boxed{391}")["reward"] == 1.0  # workers are up
    victim, replaced_before = server.pool.worker_pids[0], server.pool.replaced
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its pipe is closed (dead or a zombie)
        try:
            if psutil.Process(victim).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    for _ in range(3):
        body = verify(url, PRODUCT, "\\boxed{391}")
        assert (body["reward"], body["library_reason"]) == (1.0, "equivalent")
    assert victim not in server.pool.worker_pids and server.pool.replaced == replaced_before + 1


def test_the_judge_rescues_what_math_verify_cannot_parse(judged_url: str):
    body = verify(judged_url, WORDS_ROW, "A bird has \\boxed{2} legs.")
    assert (body["reward"], body["library_reward"]) == (1.0, 0.0)
    first, swapped = body["judge_evaluations"]
    assert first["verdict_label"] == swapped["verdict_label"] == "[[A=B]]"
    prompt = first["responses_create_params"]["input"][-1]["content"]
    assert (
        "PROBLEM:\nHow many legs does a bird have?" in prompt and "ANSWER A:\ntwo\n\nANSWER B:\n2" in prompt
    )


def test_a_judge_saying_different_scores_zero_after_one_call(judged_url: str):
    row = {**WORDS_ROW, "question": "How many legs of a spider touch the ground?"}
    body = verify(judged_url, row, "\\boxed{8}")
    assert body["reward"] == 0.0 and len(body["judge_evaluations"]) == 1


def test_the_judge_is_not_asked_when_the_symbolic_check_succeeds_or_there_is_no_answer(judged_url: str):
    assert verify(judged_url, PRODUCT, "\\boxed{391}")["judge_evaluations"] is None
    assert verify(judged_url, WORDS_ROW, "")["judge_evaluations"] is None


def test_judge_failures_are_502_judge_failed_not_zero(judge_url: str, judged_url: str):
    row = {**WORDS_ROW, "question": "How many legs of an ant are there?"}
    body = verify(judged_url, row, "\\boxed{6}", status=502)
    assert body["failure_class"] == "judge_failed" and "no verdict label" in body["error"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: refused
        with running_server(judged_server(dead)) as base:
            down = verify(base, WORDS_ROW, "\\boxed{2}", status=502)
    assert down["failure_class"] == "judge_failed" and "unreachable" in down["error"]


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rows_run_unchanged_and_replay_their_library_reward(url: str):
    for recorded, ours in replay_recorded(url, COMPAT, timeout_s=180):
        # No judge configured: the reward is the symbolic one, NeMo Gym's `library_reward`.
        assert ours["reward"] == ours["library_reward"] == recorded["library_reward"]
        assert ours["extracted_answer"] == recorded["extracted_answer"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    # At most two verifier processes; a config file, since collect_examples takes no overrides.
    limit = tmp_path / "limit.yaml"
    limit.write_text(
        "math_with_judge:\n  resources_servers:\n    math_with_judge:\n"
        "      library_verifier_max_concurrency: 2\n"
    )
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl", limit)
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["question"]: r for r in rows}
    assert {q: r["reward"] for q, r in results.items()} == {
        PRODUCT["question"]: 1.0,
        FRACTION["question"]: 1.0,
        ROOT["question"]: 1.0,
        HEXAGON["question"]: 0.0,
        INTEGRAL["question"]: 1.0,
    }
    assert results[HEXAGON["question"]]["extracted_answer"] == "360"
