"""A server process tunes Python's garbage collector: start-up objects frozen, a high young-generation
threshold; ``NEMO_GYM_GC_GEN0_THRESHOLD`` changes or (0) turns it off. Each case runs in its own
interpreter (the tuning is process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent(
    """
    import gc, json
    from nemo_gym.serving.gc_tuning import tune_gc_for_serving
    before = gc.get_threshold()
    done = tune_gc_for_serving()
    cycle = []
    cycle.append(cycle)  # made after the freeze: still collected
    del cycle
    print(json.dumps({"done": done, "before": before, "after": gc.get_threshold(),
                      "frozen": gc.get_freeze_count(), "collected": gc.collect()}))
    """
)


def probe(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NEMO_GYM_GC_GEN0_THRESHOLD", None)
    if value is not None:
        env["NEMO_GYM_GC_GEN0_THRESHOLD"] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_default_freezes_start_up_objects_and_raises_gen0_threshold() -> None:
    result = json.loads(probe(None).stdout)
    assert result["done"] is True
    assert result["after"] == [50_000, *result["before"][1:]]
    assert result["frozen"] > 1000  # the interpreter's and nemo_gym's own objects
    assert result["collected"] >= 1  # garbage made after the freeze is still collected


@pytest.mark.parametrize(("value", "gen0"), [("0", None), ("20000", 20_000)])
def test_the_environment_variable_sets_or_disables_it(value: str, gen0: int | None) -> None:
    result = json.loads(probe(value).stdout)
    if gen0 is None:
        assert result["done"] is False
        assert result["after"] == result["before"]
        assert result["frozen"] == 0
    else:
        assert result["after"][0] == gen0


def test_a_bad_value_names_the_variable() -> None:
    done = probe("lots")
    assert done.returncode != 0
    assert "NEMO_GYM_GC_GEN0_THRESHOLD='lots' is not an integer" in done.stderr
