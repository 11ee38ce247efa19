"""Python's cyclic garbage collector tuned for a server process.

A server allocates thousands of short-lived containers per request (every JSON body parsed is
dicts and lists): with the default threshold (700 allocations) the collector runs a young
collection every few requests and an older one every few dozen, each also walking the
objects the process built at start-up. :func:`tune_gc_for_serving` moves the start-up
objects out of the collector's sight (``gc.freeze``) and raises the young-generation threshold,
so collections run rarely and walk only what requests left behind. Cycles are still collected
(later); ``NEMO_GYM_GC_GEN0_THRESHOLD=0`` keeps Python's defaults.
"""

from __future__ import annotations

import gc
import os

ENV_GC_GEN0_THRESHOLD = "NEMO_GYM_GC_GEN0_THRESHOLD"
DEFAULT_GEN0_THRESHOLD = 50_000


def tune_gc_for_serving() -> bool:
    """Freeze the objects allocated so far and raise the young-generation threshold (see the
    module docstring); returns whether it did (``NEMO_GYM_GC_GEN0_THRESHOLD=0`` turns it off)."""
    value = os.environ.get(ENV_GC_GEN0_THRESHOLD, "").strip()
    try:
        threshold = int(value) if value else DEFAULT_GEN0_THRESHOLD
    except ValueError:
        raise ValueError(f"{ENV_GC_GEN0_THRESHOLD}={value!r} is not an integer") from None
    if threshold <= 0:
        return False
    gc.collect()  # what start-up left as garbage goes now, not into the frozen set
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)
    return True
