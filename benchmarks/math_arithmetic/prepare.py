"""Write the math_arithmetic benchmark: 200 procedurally generated problems with exact answers.

Offline and deterministic (seeded): the same rows on every machine. Seven problem families
(products, fraction sums, linear equations, lcm, modular powers, series sums, quadratic roots),
each with an answer math-verify can compare symbolically.

Usage: python benchmarks/math_arithmetic/prepare.py [--output PATH]
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from math import lcm
from pathlib import Path

from nemo_gym.tools.benchmarks import write_prepared_rows

NAME = "math_arithmetic"
SEED = 20240601
ROWS = 200
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / f"{NAME}.jsonl"

Problem = tuple[str, str]  # (question in LaTeX-flavoured text, expected answer)


def product(rng: random.Random) -> Problem:
    a, b = rng.randint(12, 999), rng.randint(12, 999)
    return f"Compute \\({a} \\times {b}\\).", str(a * b)


def fraction_sum(rng: random.Random) -> Problem:
    a, b = rng.randint(1, 9), rng.randint(2, 12)
    c, d = rng.randint(1, 9), rng.randint(2, 12)
    total = Fraction(a, b) + Fraction(c, d)
    answer = (
        str(total.numerator)
        if total.denominator == 1
        else f"\\(\\frac{{{total.numerator}}}{{{total.denominator}}}\\)"
    )
    return f"Write \\(\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}\\) as a fraction in lowest terms.", answer


def linear_equation(rng: random.Random) -> Problem:
    x = rng.randint(-20, 20)
    a = rng.choice([k for k in range(-9, 10) if k not in (0, 1)])
    b = rng.randint(-50, 50)
    sign = "+" if b >= 0 else "-"
    return f"Solve for \\(x\\): \\({a}x {sign} {abs(b)} = {a * x + b}\\).", str(x)


def least_common_multiple(rng: random.Random) -> Problem:
    a, b = rng.randint(4, 60), rng.randint(4, 60)
    return f"What is the least common multiple of {a} and {b}?", str(lcm(a, b))


def modular_power(rng: random.Random) -> Problem:
    base, exponent, modulus = rng.randint(2, 13), rng.randint(10, 200), rng.randint(5, 97)
    return (
        f"What is the remainder when \\({base}^{{{exponent}}}\\) is divided by {modulus}?",
        str(pow(base, exponent, modulus)),
    )


def series_sum(rng: random.Random) -> Problem:
    low = rng.randint(-30, 30)
    high = low + rng.randint(5, 150)
    return f"What is the sum of all integers from {low} to {high}, inclusive?", str(
        (low + high) * (high - low + 1) // 2
    )


def quadratic_root(rng: random.Random) -> Problem:
    r1, r2 = rng.sample(range(-15, 16), 2)
    b, c = -(r1 + r2), r1 * r2
    terms = (
        "x^2"
        + (f" {'+' if b >= 0 else '-'} {abs(b)}x" if b else "")
        + (f" {'+' if c >= 0 else '-'} {abs(c)}" if c else "")
    )
    return f"Find the larger root of \\({terms} = 0\\).", str(max(r1, r2))


FAMILIES: dict[str, Callable[[random.Random], Problem]] = {
    "product": product,
    "fraction_sum": fraction_sum,
    "linear_equation": linear_equation,
    "least_common_multiple": least_common_multiple,
    "modular_power": modular_power,
    "series_sum": series_sum,
    "quadratic_root": quadratic_root,
}


def build_rows(count: int = ROWS, seed: int = SEED) -> list[dict[str, str]]:
    """``count`` rows in math_with_judge's shape; the prompt template builds the input."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < count:
        family = names[len(rows) % len(names)]
        question, answer = FAMILIES[family](rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "expected_answer": answer, "problem_family": family})
    return rows


def main() -> None:
    write_prepared_rows(__doc__.splitlines()[0], DEFAULT_OUTPUT, build_rows)


if __name__ == "__main__":
    main()
