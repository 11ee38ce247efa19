"""Write the code_gen_procedural benchmark: 40 stdin/stdout programming tasks with generated tests.

Offline and deterministic (seeded). Ten task families, four parameter variants each. Every
task has a reference solution here; its unit-test outputs are computed by running that solution
on generated inputs (this is our own code, run in-process), so every row is solvable.

Usage: python benchmarks/code_gen_procedural/prepare.py [--output PATH]
"""

from __future__ import annotations

import hashlib
import io
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_gym.tools.benchmarks import write_prepared_rows

NAME = "code_gen_procedural"
SEED = 20240603
VARIANTS = 4
TESTS_PER_TASK = 6
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / f"{NAME}.jsonl"
INSTRUCTIONS = (
    "Write a Python 3 program for the task below. It reads standard input and writes standard "
    "output. Reason about it first, then give the complete program in one final ```python code block."
)


@dataclass(frozen=True)
class Task:
    """A statement, a reference program (source text) and a generator of test inputs."""

    family: str
    statement: str
    solution: str
    make_input: Callable[[random.Random], str]


def pair_operation(rng: random.Random, variant: int) -> Task:
    modulus = [10**9 + 7, 998244353, 1000, 97][variant]
    statement = (
        f"The first line holds an integer t (1 <= t <= 1000). Each of the next t lines holds two integers "
        f"a and b (0 <= a, b <= 10^12). For each pair print (a * b) mod {modulus} on its own line."
    )
    solution = f"""import sys
data = sys.stdin.read().split()
t = int(data[0])
print("\\n".join(str(int(data[1 + 2 * i]) * int(data[2 + 2 * i]) % {modulus}) for i in range(t)))
"""

    def make_input(r: random.Random) -> str:
        t = r.randint(1, 8)
        return f"{t}\n" + "".join(f"{r.randint(0, 10**12)} {r.randint(0, 10**12)}\n" for _ in range(t))

    return Task("pair_operation", statement, solution, make_input)


def count_character(rng: random.Random, variant: int) -> Task:
    letter = "aeiz"[variant]
    statement = (
        f"The first line holds an integer n. Each of the next n lines holds a word of lowercase letters. "
        f"For each word print how many times the letter '{letter}' occurs in it."
    )
    solution = f"""import sys
lines = sys.stdin.read().split()
n = int(lines[0])
for word in lines[1:1 + n]:
    print(word.count({letter!r}))
"""

    def make_input(r: random.Random) -> str:
        n = r.randint(1, 6)
        words = [
            "".join(r.choice("abcdefghijklmnopqrstuvwxyz" + letter * 3) for _ in range(r.randint(1, 20)))
            for _ in range(n)
        ]
        return f"{n}\n" + "".join(w + "\n" for w in words)

    return Task("count_character", statement, solution, make_input)


def max_window_sum(rng: random.Random, variant: int) -> Task:
    k = [2, 3, 4, 5][variant]
    statement = (
        f"The first line holds n ({k} <= n <= 10^5), the second n integers (|a_i| <= 10^9). Print the largest "
        f"sum of {k} consecutive elements."
    )
    solution = f"""import sys
data = sys.stdin.read().split()
n = int(data[0])
a = list(map(int, data[1:1 + n]))
window = sum(a[:{k}])
best = window
for i in range({k}, n):
    window += a[i] - a[i - {k}]
    best = max(best, window)
print(best)
"""

    def make_input(r: random.Random) -> str:
        n = r.randint(k, 12)
        return f"{n}\n" + " ".join(str(r.randint(-(10**9), 10**9)) for _ in range(n)) + "\n"

    return Task("max_window_sum", statement, solution, make_input)


def fizz_words(rng: random.Random, variant: int) -> Task:
    (a, word_a), (b, word_b) = [
        ((3, "Fizz"), (5, "Buzz")),
        ((2, "Ping"), (7, "Pong")),
        ((4, "Tik"), (6, "Tok")),
        ((3, "Red"), (8, "Blue")),
    ][variant]
    statement = (
        f"Read two integers l and r (1 <= l <= r <= 10^4). For every integer x from l to r print, on its own line, "
        f"'{word_a}{word_b}' if x is divisible by both {a} and {b}, '{word_a}' if only by {a}, '{word_b}' if only by {b}, "
        f"and x itself otherwise."
    )
    solution = f"""l, r = map(int, input().split())
for x in range(l, r + 1):
    word = ("{word_a}" if x % {a} == 0 else "") + ("{word_b}" if x % {b} == 0 else "")
    print(word or x)
"""

    def make_input(r: random.Random) -> str:
        low = r.randint(1, 60)
        return f"{low} {low + r.randint(0, 25)}\n"

    return Task("fizz_words", statement, solution, make_input)


def gcd_of_list(rng: random.Random, variant: int) -> Task:
    use_gcd, top = [(True, 10**6), (False, 30), (True, 10**9), (False, 50)][variant]
    operation = "greatest common divisor" if use_gcd else "least common multiple"
    statement = (
        f"The first line holds n (1 <= n <= 20), the second n positive integers, each at most {top}. "
        f"Print their {operation}."
    )
    combine = "math.gcd(result, v)" if use_gcd else "result * v // math.gcd(result, v)"
    solution = f"""import math
import sys
data = sys.stdin.read().split()
values = list(map(int, data[1:1 + int(data[0])]))
result = values[0]
for v in values[1:]:
    result = {combine}
print(result)
"""

    def make_input(r: random.Random) -> str:
        n = r.randint(1, 8)
        factor = r.randint(1, 50) if use_gcd else 1
        values = [factor * r.randint(1, top // factor) for _ in range(n)]
        return f"{n}\n" + " ".join(map(str, values)) + "\n"

    return Task("list_gcd_lcm", statement, solution, make_input)


def sort_unique(rng: random.Random, variant: int) -> Task:
    descending = variant % 2 == 1
    keep_duplicates = variant >= 2
    order = "decreasing" if descending else "increasing"
    which = "all the numbers" if keep_duplicates else "the distinct numbers"
    statement = (
        f"The first line holds n (1 <= n <= 10^5), the second n integers. Print {which} in {order} order, "
        f"separated by single spaces, on one line."
    )
    values_expr = "values" if keep_duplicates else "set(values)"
    solution = f"""import sys
data = sys.stdin.read().split()
values = list(map(int, data[1:1 + int(data[0])]))
print(" ".join(map(str, sorted({values_expr}, reverse={descending}))))
"""

    def make_input(r: random.Random) -> str:
        n = r.randint(1, 12)
        return f"{n}\n" + " ".join(str(r.randint(-20, 20)) for _ in range(n)) + "\n"

    return Task("sort_numbers", statement, solution, make_input)


def balanced_brackets(rng: random.Random, variant: int) -> Task:
    pairs = ["()", "()[]", "()[]{}", "<>()"][variant]
    shown = " ".join(pairs[i : i + 2] for i in range(0, len(pairs), 2))
    statement = (
        f"The first line holds n. Each of the next n lines holds a non-empty string made of the bracket "
        f"characters {shown}. For each string print YES if its brackets are balanced and properly nested, else NO."
    )
    solution = f"""import sys
pairs = {pairs!r}
closing = {{pairs[i + 1]: pairs[i] for i in range(0, len(pairs), 2)}}
lines = sys.stdin.read().split()
for s in lines[1:1 + int(lines[0])]:
    stack = []
    ok = True
    for ch in s:
        if ch in closing:
            if not stack or stack.pop() != closing[ch]:
                ok = False
                break
        else:
            stack.append(ch)
    print("YES" if ok and not stack else "NO")
"""

    def nested(r: random.Random, depth: int) -> str:
        text = ""
        for _ in range(r.randint(1, 3)):
            i = r.randrange(0, len(pairs), 2)
            inner = nested(r, depth - 1) if depth > 0 and r.random() < 0.6 else ""
            text += pairs[i] + inner + pairs[i + 1]
        return text

    def make_input(r: random.Random) -> str:
        strings = []
        for _ in range(r.randint(1, 6)):
            text = nested(r, 2)
            if r.random() < 0.5:  # break it: drop or replace one character
                k = r.randrange(len(text))
                text = text[:k] + r.choice(["", r.choice(pairs)]) + text[k + 1 :] or pairs[1]
            strings.append(text)
        return f"{len(strings)}\n" + "".join(t + "\n" for t in strings)

    return Task("balanced_brackets", statement, solution, make_input)


def count_primes(rng: random.Random, variant: int) -> Task:
    kind, bound = [
        ("primes", "10^6"),
        ("composite numbers", "10^6"),
        ("primes", "10^5"),
        ("composite numbers", "10^5"),
    ][variant]
    statement = (
        f"The first line holds q. Each of the next q lines holds two integers l and r (1 <= l <= r <= {bound}). "
        f"For each query print how many {kind} lie in [l, r]."
    )
    solution = f"""import sys
data = sys.stdin.read().split()
q = int(data[0])
queries = [(int(data[1 + 2 * i]), int(data[2 + 2 * i])) for i in range(q)]
top = max(r for _, r in queries)
sieve = bytearray([1]) * (top + 1)
sieve[0] = 0
if top >= 1:
    sieve[1] = 0
for p in range(2, int(top ** 0.5) + 1):
    if sieve[p]:
        sieve[p * p::p] = bytearray(len(range(p * p, top + 1, p)))
prefix = [0] * (top + 1)
for i in range(1, top + 1):
    prefix[i] = prefix[i - 1] + sieve[i]
for l, r in queries:
    primes = prefix[r] - prefix[l - 1]
    print({"primes" if kind == "primes" else "(r - l + 1) - primes - (1 if l <= 1 else 0)"})
"""

    def make_input(r: random.Random) -> str:
        q = r.randint(1, 5)
        lines = []
        for _ in range(q):
            low = r.randint(1, 5000)
            lines.append(f"{low} {low + r.randint(0, 5000)}\n")
        return f"{q}\n" + "".join(lines)

    return Task("count_primes", statement, solution, make_input)


def run_length(rng: random.Random, variant: int) -> Task:
    decode = variant % 2 == 1
    separator = ["", "", "-", "-"][variant]
    if decode:
        statement = (
            "Each line of the input holds a run-length encoding: groups of a lowercase letter followed by "
            f"a positive count{' with a - between groups' if separator else ''} (for example "
            f"{'a3-b1' if separator else 'a3b1'}). For each line print the decoded string."
        )
        solution = """import re
import sys
for line in sys.stdin.read().split():
    print("".join(ch * int(n) for ch, n in re.findall(r"([a-z])([0-9]+)", line)))
"""
    else:
        statement = (
            "Each line of the input holds a non-empty string of lowercase letters. For each line print its "
            "run-length encoding: for each maximal run of one letter, the letter followed by the run length"
            f"{', with a - between groups' if separator else ''} (for example aaab becomes "
            f"{'a3-b1' if separator else 'a3b1'})."
        )
        solution = f"""import itertools
import sys
for line in sys.stdin.read().split():
    print({separator!r}.join(ch + str(len(list(run))) for ch, run in itertools.groupby(line)))
"""

    def make_input(r: random.Random) -> str:
        lines = []
        for _ in range(r.randint(1, 5)):
            groups = [(r.choice("abcxyz"), r.randint(1, 4)) for _ in range(r.randint(1, 5))]
            merged: list[tuple[str, int]] = []
            for ch, n in groups:
                if merged and merged[-1][0] == ch:
                    merged[-1] = (ch, merged[-1][1] + n)
                else:
                    merged.append((ch, n))
            if decode:
                lines.append(separator.join(f"{ch}{n}" for ch, n in merged))
            else:
                lines.append("".join(ch * n for ch, n in merged))
        return "".join(line + "\n" for line in lines)

    return Task("run_length", statement, solution, make_input)


def matrix_trace(rng: random.Random, variant: int) -> Task:
    what = ["main diagonal", "anti-diagonal", "border", "two diagonals"][variant]
    statement = (
        f"The first line holds n (1 <= n <= 500). The next n lines hold n integers each. Print the sum of the "
        f"elements on the {what} of the matrix{' (each element counted once)' if what in ('border', 'two diagonals') else ''}."
    )
    picks = {
        "main diagonal": "i == j",
        "anti-diagonal": "i + j == n - 1",
        "border": "i in (0, n - 1) or j in (0, n - 1)",
        "two diagonals": "i == j or i + j == n - 1",
    }[what]
    solution = f"""import sys
data = sys.stdin.read().split()
n = int(data[0])
values = list(map(int, data[1:1 + n * n]))
print(sum(values[i * n + j] for i in range(n) for j in range(n) if {picks}))
"""

    def make_input(r: random.Random) -> str:
        n = r.randint(1, 6)
        return f"{n}\n" + "".join(
            " ".join(str(r.randint(-99, 99)) for _ in range(n)) + "\n" for _ in range(n)
        )

    return Task("matrix_sum", statement, solution, make_input)


FAMILIES = [
    pair_operation,
    count_character,
    max_window_sum,
    fizz_words,
    gcd_of_list,
    sort_unique,
    balanced_brackets,
    count_primes,
    run_length,
    matrix_trace,
]


def run_reference(solution: str, stdin: str) -> str:
    """Run a reference program in-process on ``stdin``; returns what it printed."""
    saved_in, saved_out = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.StringIO(stdin), io.StringIO()
    try:
        exec(compile(solution, "<reference>", "exec"), {"__name__": "__main__"})  # noqa: S102 - our own code
        return sys.stdout.getvalue()
    finally:
        sys.stdin, sys.stdout = saved_in, saved_out


def build_tasks(seed: int = SEED) -> list[tuple[Task, list[str], list[str]]]:
    """Every task with its test inputs and the reference outputs."""
    rng = random.Random(seed)
    built = []
    for family in FAMILIES:
        for variant in range(VARIANTS):
            task = family(rng, variant)
            inputs: list[str] = []
            while len(inputs) < TESTS_PER_TASK:
                candidate = task.make_input(rng)
                if candidate not in inputs:
                    inputs.append(candidate)
            built.append((task, inputs, [run_reference(task.solution, i) for i in inputs]))
    return built


def build_rows(seed: int = SEED) -> list[dict[str, object]]:
    """Rows in code_gen's shape (``verifier_metadata.unit_tests``), one per task variant."""
    rows = []
    for task, inputs, outputs in build_tasks(seed):
        example_in, example_out = inputs[0], outputs[0]
        prompt = f"{INSTRUCTIONS}\n\n{task.statement}\n\nExample\nInput\n{example_in}Output\n{example_out}"
        rows.append(
            {
                "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
                "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
                "hash_id": hashlib.md5(prompt.encode()).hexdigest(),
                "dataset": NAME,
                "source": task.family,
            }
        )
    return rows


def main() -> None:
    write_prepared_rows(__doc__.splitlines()[0], DEFAULT_OUTPUT, build_rows)


if __name__ == "__main__":
    main()
