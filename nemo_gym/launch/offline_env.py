"""The environment switches under which the libraries environment folders use stay off the network
on their own: what ``gym env test`` gives a folder's tests and a launch gives each server.

Nothing here downloads at run time (docs/NEMO_GYM_ENVIRONMENTS.md, *Offline by default*). A few
libraries NeMo Gym's folders import fetch or send something by themselves unless told not to, with
a switch that makes them use what is installed instead and changes no result:

- litellm fetches its model cost map from GitHub while it is imported (a first attempt that waits
  up to 5 s where the network drops packets, then retries in a thread); with
  ``LITELLM_LOCAL_MODEL_COST_MAP=True`` it reads the copy bundled with it.
- huggingface_hub sends usage telemetry with some calls (``HF_HUB_DISABLE_TELEMETRY=1``: none).
- Ray reports usage statistics from its head (``RAY_USAGE_STATS_ENABLED=0``: none).

A value already in the environment wins, so a user who wants the live cost map exports
``LITELLM_LOCAL_MODEL_COST_MAP=False``. Switches that change what a library does with a reachable
host are not set: ``HF_HUB_OFFLINE=1`` turns every hub call into an error, even one to a mirror or
a loopback fake named by ``HF_ENDPOINT``, so it could change a test's outcome.
"""

from __future__ import annotations

from collections.abc import Mapping

OFFLINE_SWITCHES: Mapping[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def with_offline_switches(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each of :data:`OFFLINE_SWITCHES` that it does not set already."""
    return {**OFFLINE_SWITCHES, **env}


__all__ = ["OFFLINE_SWITCHES", "with_offline_switches"]
