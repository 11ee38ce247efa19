"""A server process scheduled as batch work (Linux's ``SCHED_BATCH``): the peer a hop wakes
does not preempt the server that woke it.

Every hop wakes a process: a tool call wakes the resources server, its answer wakes the agent,
a model call wakes the model server and then the policy. Under Linux's default policy a woken
process that has slept a while preempts the one that woke it at once when they share a CPU, so
the writer is switched out in the middle of its answer and switched back in only to finish the
request and go to sleep: two switches per side instead of one, and each process finds its caches
holding the other's data. Under ``SCHED_BATCH`` a woken server waits until the running one sleeps
or uses up its time slice, which after an answer is a few microseconds. Measured on the
long-horizon benchmark (docs/PERFORMANCE.md): about a fifth less CPU per 96-turn rollout and a
quarter more rollouts/s on 2 cores.

CPU shares do not change (the nice level stays); only wake-up preemption is given up, so on a
saturated machine a hop can wait behind a busy process for up to one time slice (milliseconds)
before it is served, and processes under the default policy (an inference server on the same
host) are no longer preempted by our servers' wake-ups. No privilege is needed, and threads the
server starts later inherit the policy. ``NEMO_GYM_SCHED_BATCH=0`` keeps the default policy; on
systems without ``SCHED_BATCH`` nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os

from nemo_gym.serving.protocol import switched_on

logger = logging.getLogger("nemo_gym")

ENV_SCHED_BATCH = "NEMO_GYM_SCHED_BATCH"


def batch_scheduling_for_serving() -> bool:
    """Put every thread of this process under ``SCHED_BATCH`` (see the module docstring); returns
    whether it did (not when ``NEMO_GYM_SCHED_BATCH=0``, or the system has no such policy)."""
    if not switched_on(ENV_SCHED_BATCH):
        return False
    set_policy = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if set_policy is None or batch is None:
        return False
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread: those it starts inherit the policy
    done = False
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that just ended, or a sandbox refusing it
            set_policy(tid, batch, os.sched_param(0))
            done = True
    if not done:
        logger.debug("SCHED_BATCH refused for this server process; the default policy stays")
    return done


def default_scheduling() -> None:
    """The default policy back for a program a server starts whose latency matters more than the
    server's batching (an inference engine): a ``preexec_fn``, run in the child before it execs.
    Children otherwise inherit ``SCHED_BATCH`` (sandboxed code and harness programs: batch work)."""
    set_policy = getattr(os, "sched_setscheduler", None)
    other = getattr(os, "SCHED_OTHER", None)
    if set_policy is None or other is None:
        return
    with contextlib.suppress(OSError):
        set_policy(0, other, os.sched_param(0))
