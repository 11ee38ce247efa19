"""A producer's own pass over its observation bundle when captured model calls are merged in.

An agent folder that reports ``ng_agent_observations`` may know more about its records than
the generic join (:func:`~nemo_gym.collection.trajectory_evidence.join_model_call_observations`)
can: which captured call was its context compaction, say. NeMo Gym's merge of a rollout's model
calls (``merge_model_call_capture_into_record``) hands the bundle and the calls to that folder
first, found by the bundle's ``source``: the folder ``responses_api_agents/<source>_agent``, its
``observability`` module, ``associate_<source>_compaction_calls(bundle, calls)`` returning the
bundle with the calls it could tie to its records (``claude_code`` for ``claude_code_agent``).

The same name is looked up here, for any source, when the merge runs: nothing in ``nemo_gym``
names a folder, a folder that ships no such module simply has no pass, and a pass that fails is
the caller's gap to record, never a lost row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

AGENTS_PACKAGE = "responses_api_agents"

CallAssociation = Callable[[Any, list[Any]], Any]


def compaction_call_association(source: str) -> CallAssociation | None:
    """The producer's ``associate_<source>_compaction_calls`` for bundles of ``source``, or None
    when no importable agent folder defines one.

    Looked up at each call (a test that patches the function is honoured). An import that fails
    for another reason than the module's absence (the folder's own import error) raises.
    """
    if not source.isidentifier():  # a bundle's source is data: it never names a dotted path
        return None
    module_name = f"{AGENTS_PACKAGE}.{source}_agent.observability"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(f"{missing}."):
            return None  # no such folder or module: the producer has no pass of its own
        raise
    hook = getattr(module, f"associate_{source}_compaction_calls", None)
    return hook if callable(hook) else None
