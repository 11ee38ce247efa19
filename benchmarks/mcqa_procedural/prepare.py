"""Write the mcqa_procedural benchmark: 200 generated four-option questions with one right answer.

Offline and deterministic (seeded). Six question families whose right option is computed, and
whose wrong options are computed to be wrong: primes, the largest of four fractions, percentages,
alphabetical order, unit conversion and divisibility. The right letter is spread evenly.

Usage: python benchmarks/mcqa_procedural/prepare.py [--output PATH]
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from nemo_gym.tools.benchmarks import write_prepared_rows

NAME = "mcqa_procedural"
SEED = 20240602
ROWS = 200
LETTERS = "ABCD"
UUID_NAMESPACE = uuid.UUID("6f1d3c1e-55a1-4d7e-9f43-2b8f0a6c9e10")
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / f"{NAME}.jsonl"
WORDS = (
    "anchor basalt cobalt dynamo ember falcon garnet harbor indigo jasper kelp lumen marble nectar "
    "onyx prism quartz raven sable tundra umber velvet willow xenon yarrow zephyr"
).split()

Question = tuple[str, str, list[str]]  # (stem, right option, three wrong options)


def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))


def prime(rng: random.Random) -> Question:
    right = rng.choice([n for n in range(20, 400) if is_prime(n)])
    wrong = rng.sample([n for n in range(20, 400) if not is_prime(n) and n % 2 and n % 5], 3)
    return "Which of the following numbers is prime?", str(right), [str(n) for n in wrong]


def largest_fraction(rng: random.Random) -> Question:
    fractions: set[Fraction] = set()
    while len(fractions) < 4:
        fractions.add(Fraction(rng.randint(1, 19), rng.randint(2, 20)))
    ordered = sorted(fractions)
    show = [f"{f.numerator}/{f.denominator}" for f in ordered]
    return "Which of the following fractions is the largest?", show[-1], show[:-1]


def percentage(rng: random.Random) -> Question:
    percent, base = rng.choice([5, 10, 15, 20, 25, 30, 40, 60, 75]), rng.randint(2, 60) * 20
    right = percent * base // 100
    wrong = {right + base // 10, max(1, right - base // 20), right * 2, right + percent} - {right}
    return f"What is {percent}% of {base}?", str(right), [str(n) for n in sorted(wrong)[:3]]


def alphabetical(rng: random.Random) -> Question:
    words = rng.sample(WORDS, 4)
    first = min(words)
    return (
        "Which of the following words comes first in alphabetical order?",
        first,
        [w for w in words if w != first],
    )


def minutes(rng: random.Random) -> Question:
    hours, extra = rng.randint(1, 9), rng.choice([0, 15, 30, 45])
    right = hours * 60 + extra
    wrong = [hours * 100 + extra, right + 60, hours * 60 + extra // 2 + 10]
    when = f"{hours} hours" + (f" and {extra} minutes" if extra else "")
    return f"How many minutes are there in {when}?", str(right), [str(n) for n in wrong]


def divisibility(rng: random.Random) -> Question:
    k = rng.randint(6, 19)
    right = k * rng.randint(3, 40)
    wrong: set[int] = set()
    while len(wrong) < 3:
        n = right + rng.randint(-k + 1, k - 1)
        if n % k:
            wrong.add(n)
    return f"Which of the following numbers is divisible by {k}?", str(right), [str(n) for n in sorted(wrong)]


FAMILIES: dict[str, Callable[[random.Random], Question]] = {
    "prime": prime,
    "largest_fraction": largest_fraction,
    "percentage": percentage,
    "alphabetical": alphabetical,
    "minutes": minutes,
    "divisibility": divisibility,
}


def build_rows(count: int = ROWS, seed: int = SEED) -> list[dict[str, object]]:
    """``count`` rows in mcqa's shape (``options``, ``expected_answer``, ``grading_mode``)."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    rows: list[dict[str, object]] = []
    seen: set[str] = set()
    while len(rows) < count:
        family = names[len(rows) % len(names)]
        stem, right, wrong = FAMILIES[family](rng)
        if len({right, *wrong}) != len(LETTERS) or len(wrong) != len(LETTERS) - 1:
            continue  # a collision among the computed options: draw again
        answer_letter = LETTERS[len(rows) % len(LETTERS)]
        shuffled = rng.sample(wrong, len(wrong))
        choices = (
            shuffled[: LETTERS.index(answer_letter)] + [right] + shuffled[LETTERS.index(answer_letter) :]
        )
        question = (
            stem
            + "\n"
            + "\n".join(f"{letter}: {text}" for letter, text in zip(LETTERS, choices, strict=True))
        )
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "question": question,
                "options": [{letter: text} for letter, text in zip(LETTERS, choices, strict=True)],
                "expected_answer": answer_letter,
                "grading_mode": "strict_single_letter_boxed",
                "uuid": str(uuid.uuid5(UUID_NAMESPACE, question)),
                "question_family": family,
            }
        )
    return rows


def main() -> None:
    write_prepared_rows(__doc__.splitlines()[0], DEFAULT_OUTPUT, build_rows)


if __name__ == "__main__":
    main()
