"""Write the reasoning_gym_mix benchmark: 120 procedurally generated reasoning tasks, 8 task types.

Offline and deterministic: the rows come from the ``reasoning_gym`` package's generators with
fixed seeds (one seed per task type), in NeMo Gym's reasoning_gym row shape (``question``,
``answer``, ``metadata.source_dataset``). The rows depend on the installed reasoning_gym version;
the committed statistics (``data/reasoning_gym_mix_metrics.json``) catch a version that generates
different tasks.

Usage: python benchmarks/reasoning_gym_mix/prepare.py [--output PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nemo_gym.tools.benchmarks import write_prepared_rows

NAME = "reasoning_gym_mix"
SEED = 20240604
ROWS_PER_TASK = 15
# Small, fast generators that need no network; answers are short strings scored by reasoning_gym.
TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "gcd",
    "letter_counting",
    "spell_backward",
    "word_sorting",
    "knights_knaves",
    "number_sorting",
)
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / f"{NAME}.jsonl"


def build_rows(rows_per_task: int = ROWS_PER_TASK, seed: int = SEED) -> list[dict[str, Any]]:
    """Rows in the reasoning_gym environment's shape, task types interleaved."""
    import reasoning_gym

    per_task = [
        list(reasoning_gym.create_dataset(task, size=rows_per_task, seed=seed + index))
        for index, task in enumerate(TASKS)
    ]
    rows = []
    for position in range(rows_per_task):
        for entries in per_task:
            entry = entries[position]
            rows.append(
                {
                    "responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]},
                    "question": entry["question"],
                    "answer": entry["answer"],
                    "metadata": entry["metadata"],
                }
            )
    return rows


def require_reasoning_gym() -> None:
    """Exit with a clear message when the package that generates the tasks is missing."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError:
        sys.stderr.write(
            f"cannot prepare {NAME}: the reasoning_gym package is not installed "
            "(pip install reasoning-gym; it generates the tasks offline)\n"
        )
        raise SystemExit(1) from None


def main() -> None:
    write_prepared_rows(__doc__.splitlines()[0], DEFAULT_OUTPUT, build_rows, check=require_reasoning_gym)


if __name__ == "__main__":
    main()
