"""mcqa: extraction modes, adversarial answers, majority@k metrics, NeMo Gym replay, end to end."""

from pathlib import Path

import pytest

from nemo_gym.response_items import message_item
from nemo_gym.testing import (
    SyncClient,
    collect_examples,
    compat_dir,
    post_verify,
    read_jsonl,
    replay_recorded,
    running_server,
)
from resources_servers.mcqa.app import MCQAServer, boxed_contents

HERE = Path(__file__).resolve().parent.parent
COMPAT = compat_dir("mcqa")
ROWS = read_jsonl(HERE / "data" / "example.jsonl")
STRICT, LENIENT_BOXED, ANSWER_COLON, REGEX_ROW, _ = ROWS


@pytest.fixture(scope="module")
def url():
    with running_server(MCQAServer({"name": "mcqa"})) as base:
        yield base


def verify(url: str, row: dict, *texts: str, status: int = 200) -> dict:
    return post_verify(url, row, {"output": [message_item(t) for t in texts]}, status)


def letter(url: str, row: dict, text: str) -> str | None:
    return verify(url, row, text)["extracted_answer"]


def test_boxed_letter_right_and_wrong(url: str):
    right = verify(url, STRICT, "Mercury orbits fastest. \\boxed{B}")
    assert (right["reward"], right["extracted_answer"], right["extraction"]) == (1.0, "B", "boxed")
    assert right["expected_answer"] == "B" and right["uuid"] == STRICT["uuid"]
    wrong = verify(url, STRICT, "\\boxed{C}")
    assert (wrong["reward"], wrong["extracted_answer"]) == (0.0, "C")


def test_the_last_box_wins_and_padding_or_text_wrappers_are_tolerated(url: str):
    assert letter(url, STRICT, "First I thought \\boxed{C}, but on reflection \\boxed{B}") == "B"
    assert letter(url, STRICT, "\\boxed{B} ... no wait, \\boxed{C}") == "C"
    assert letter(url, STRICT, "Final: \\boxed{ [B] }") == "B"
    assert letter(url, STRICT, "\\[\\boxed{\\text{B}}\\]") == "B"
    # Only \\text{} is unwrapped (as in NeMo Gym): a \\textbf{} box holds no lone letter.
    assert letter(url, STRICT, "\\boxed{\\textbf{(B)}}") is None


def test_several_letters_or_letters_outside_the_options_score_zero(url: str):
    for text in ["\\boxed{A, B}", "\\boxed{AB}", "\\boxed{B or C}", "\\boxed{b}", "\\boxed{Mercury}"]:
        body = verify(url, STRICT, text)
        assert (body["reward"], body["extracted_answer"]) == (0.0, None), text
    # STRICT offers A-D only: E and Z are not options, even though they are single letters.
    assert letter(url, STRICT, "\\boxed{E}") is None
    assert letter(url, STRICT, "\\boxed{Z}") is None
    # A labelled letter followed by its option text counts as that letter.
    assert letter(url, STRICT, "\\boxed{B: Mercury}") == "B"
    assert letter(url, STRICT, "\\boxed{\\text{B: Mercury}}") == "B"


def test_malformed_answers(url: str):
    assert letter(url, STRICT, "\\boxed{B") is None  # unterminated
    assert letter(url, STRICT, "The answer is B.") is None  # no box in boxed mode
    assert letter(url, STRICT, "\\boxed{}") is None
    assert letter(url, STRICT, "\\boxed{B}} trailing brace") == "B"
    assert boxed_contents("\\boxed{\\frac{1}{2}} and \\boxed{x") == ["\\frac{1}{2}"]


def test_lenient_boxed_matches_a_label_or_exactly_one_option_text(url: str):
    assert letter(url, LENIENT_BOXED, "\\boxed{D}") == "D"
    assert letter(url, LENIENT_BOXED, "\\boxed{\\text{nitrogen}}") == "D"
    assert letter(url, LENIENT_BOXED, "\\boxed{D: Nitrogen}") == "D"
    assert letter(url, LENIENT_BOXED, "\\boxed{carbon dioxide}") == "B"
    # "Oxygen" and "Carbon dioxide" both occur in the box: ambiguous, so no answer.
    assert letter(url, LENIENT_BOXED, "\\boxed{oxygen and carbon dioxide}") is None


def test_answer_colon_reads_the_first_answer_line(url: str):
    # NeMo Gym's lenient_answer_colon takes the FIRST "Answer:" (lenient_answer_colon_md the last usable one).
    body = verify(url, ANSWER_COLON, "Answer: B\nOn reflection:\nAnswer: A")
    assert (body["reward"], body["extracted_answer"], body["extraction"]) == (1.0, "B", "answer_colon")
    assert letter(url, ANSWER_COLON, "answer: b") == "B"
    assert letter(url, ANSWER_COLON, "Answer: O(log n)") == "B"
    assert letter(url, ANSWER_COLON, "Answer: \\text{B}") == "B"
    for text in ["Answer: **B**", "Answer: B and C", "Answer: Q", "Answer: B."]:
        assert letter(url, ANSWER_COLON, text) is None, text


def test_markdown_answer_colon_mode_from_server_config():
    with running_server(MCQAServer({"name": "mcqa", "grading_mode": "lenient_answer_colon_md"})) as base:
        # The server's mode overrides the row's (ANSWER_COLON says lenient_answer_colon).
        assert letter(base, ANSWER_COLON, "Answer: **B**") == "B"
        assert letter(base, ANSWER_COLON, "Answer: B\nAnswer: A or C") == "B"
        assert letter(base, ANSWER_COLON, "Answer: أ") == "A"  # Arabic letter for A
        assert letter(base, STRICT, "\\boxed{B}") is None  # no Answer: line


def test_per_row_regex_is_tried_first_and_its_last_match_wins(url: str):
    body = verify(url, REGEX_ROW, "Selected option: A\nHmm, no.\nSelected option: C")
    assert (body["reward"], body["extracted_answer"], body["extraction"]) == (1.0, "C", "output_regex")
    assert letter(url, REGEX_ROW, "selected OPTION: c") == "C"  # case-insensitive, as in NeMo Gym
    # No regex match: the row's grading mode (strict boxed) still applies.
    fallback = verify(url, REGEX_ROW, "\\boxed{C}")
    assert (fallback["extracted_answer"], fallback["extraction"]) == ("C", "boxed")
    # A single letter the regex captures is trusted even if it is not an option (NeMo Gym's rule).
    assert verify(url, REGEX_ROW, "Selected option: G")["extracted_answer"] == "G"
    assert (
        letter(
            url,
            {**REGEX_ROW, "template_metadata": {"output_regex": ["Final: (\\w)", "Pick (\\w)"]}},
            "Pick c",
        )
        == "C"
    )


def test_bad_rows_get_422_naming_the_field(url: str):
    # An invalid per-row regex is not the row's fault alone: grading falls back and says why.
    bad_regex = {**REGEX_ROW, "template_metadata": {"output_regex": "([A-Z"}}
    body = verify(url, bad_regex, "\\boxed{C}")
    assert (body["reward"], body["extraction"]) == (1.0, "boxed")
    assert "template_metadata.output_regex" in body["output_regex_error"]
    assert "expected_answer" in verify(url, {**STRICT, "expected_answer": "Q"}, "x", status=422)["error"]
    missing = {k: v for k, v in STRICT.items() if k != "expected_answer"}
    assert "expected_answer" in verify(url, missing, "x", status=422)["error"]
    assert (
        verify(url, {**STRICT, "grading_mode": "fuzzy"}, "x", status=422)["detail"][0]["field"]
        == "grading_mode"
    )


def test_empty_or_textless_responses_score_zero_and_a_missing_response_is_422(url: str):
    for output in ([], [{"type": "reasoning", "summary": []}], [message_item("")]):
        with SyncClient() as client:
            status, body = client.post(url + "/verify", {**STRICT, "response": {"output": output}})
        assert status == 200 and (body["reward"], body["extracted_answer"]) == (0.0, None)
    with SyncClient() as client:
        status, body = client.post(url + "/verify", STRICT)  # no response at all: a client error
    assert status == 422 and body["detail"][0]["field"] == "response"


def test_rows_without_options_take_letters_from_the_prompt(url: str):
    bare = {k: v for k, v in STRICT.items() if k != "options"}
    assert letter(url, bare, "\\boxed{B}") == "B"
    assert letter(url, bare, "\\boxed{E}") is None  # the prompt lists A-D


# Inputs and what NeMo Gym 0.7.0's strict_single_letter_boxed reads from them (its rule run on
# each text): the last box, stripped, \text{} unwrapped, a lone capital or a labelled one.
NEMO_GYM_070_STRICT = [
    ("\\boxed{\nC: An individual with a family history\n}", "C"),  # the recorded rollout's box
    ("\\boxed{C. text}", "C"),
    ("\\boxed{C - text}", "C"),
    ("\\boxed{ C : foo}", "C"),
    ("\\boxed{C\n: x}", "C"),
    ("\\boxed{1. C}", "C"),
    ("\\boxed{$C$}", "C"),
    ("\\boxed{(C)}", "C"),
    ("\\boxed{\\text{ C: x }}", "C"),
    ("\\boxed{c}", None),
    ("\\boxed{AB}", None),
    ("\\boxed{A and B}", None),
    ("\\boxed{Option C}", None),
    ("\\boxed{\\textbf{C}}", None),
    ("\\boxed{\\mathrm{C}}", None),
    ("\\boxed{C\\text{: foo}}", None),
    ("x \\boxed{B} y \\boxed{C", None),
]


@pytest.mark.parametrize("text, expected", NEMO_GYM_070_STRICT)
def test_strict_boxed_reads_what_nemo_gym_070_reads(url: str, text: str, expected: str | None):
    assert letter(url, STRICT, text) == expected


def test_metrics_give_pass_and_majority_at_k(url: str):
    rollouts = []
    for task, answers in enumerate([["B", "B", "C"], ["A", "C", "C"]]):
        for index, answer in enumerate(answers):
            scored = verify(url, STRICT, f"\\boxed{{{answer}}}")
            rollouts.append({**scored, "_ng_task_index": task, "_ng_rollout_index": index})
    with SyncClient() as client:
        status, metrics = client.post(url + "/aggregate_metrics", {"verify_responses": rollouts})
    assert status == 200
    agent = metrics["agent_metrics"]
    # Task 0: majority answer B (right); task 1: majority C (wrong). Task 0 passes at k=3.
    assert agent["majority@3/reward"] == 50.0
    assert agent["pass@3/reward"] == 50.0
    assert agent["mean/reward"] == pytest.approx(2 / 6)


@pytest.mark.skipif(not COMPAT.exists(), reason="compat corpus not present")
def test_nemo_gym_rows_run_unchanged_and_replay_their_rewards(url: str):
    # As recorded (NeMo Gym's rollout rows lost `options`), and joined with the source row.
    for join in (None, lambda recorded, source: {**source, **recorded}):
        replayed = replay_recorded(url, COMPAT, join)
        assert len(replayed) == 5
        for recorded, ours in replayed:
            if "\\boxed{\nC: An individual" in recorded["response"]["output"][-1]["content"][0]["text"]:
                # Recorded before NeMo Gym read a labelled box (`\boxed{C: option text}`) as its
                # letter; NeMo Gym's current rule (commit 07d6b0d, its strict-boxed LaTeX tests)
                # and ours read C, the gold letter. See README "NeMo Gym parity".
                assert (recorded["reward"], recorded["extracted_answer"]) == (0.0, None)
                assert (ours["reward"], ours["extracted_answer"]) == (1.0, "C")
                continue
            assert ours["reward"] == recorded["reward"]
            assert ours["extracted_answer"] == recorded["extracted_answer"]


@pytest.mark.slow
def test_end_to_end_collection_with_the_scripted_model(tmp_path: Path):
    summary, rows = collect_examples(HERE, tmp_path / "rollouts.jsonl")
    assert (summary.succeeded, summary.failed) == (5, 0)
    results = {r["uuid"]: r for r in rows}
    assert {u: r["reward"] for u, r in results.items()} == {
        "mcqa-ex-0001": 1.0,
        "mcqa-ex-0002": 1.0,
        "mcqa-ex-0003": 1.0,
        "mcqa-ex-0004": 1.0,
        "mcqa-ex-0005": 0.0,
    }
    assert results["mcqa-ex-0005"]["extracted_answer"] == "A"
