"""Trainable trajectories from a frozen capture: chains of calls, each extending its parent.

Each entry says at request time whether it is a root, continues a proven parent, or has unknown
ancestry. :func:`prefix_merging` joins a child to its recorded parent only when the parent's
digest matches the child's prompt prefix; an unresolved call starts a fragment of its own, and
no token-prefix guess ever crosses that boundary. Prefix matching is used for one thing: a
resolved parent missing from the snapshot (e.g. it generated nothing and was filtered) may be
replaced by the one surviving call the child's prompt extends. Retries of one prompt keep the
one on the terminal path (or that was continued); the others are quarantined.

Loss masks follow provenance: generated tokens (mask 1) keep their log-probs, everything
between one call's generation and the next call's prompt end (tool output, user turns, template
tokens) is prompt (mask 0). :func:`assert_prefix_contiguity` is the invariant a trainer relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, compute_digest


@dataclass
class ChainLink:
    """One call of a chain and the prompt tokens added since its parent's generation."""

    entry: TokenEntry
    interstitial: list[int]


@dataclass
class Chain:
    """Calls from a root to a leaf, each extending the previous one's tokens."""

    chain_id: str
    links: list[ChainLink] = field(default_factory=list)
    root_prompt: list[int] = field(default_factory=list)

    def validate(self) -> None:
        """Raise ``ValueError`` when a call's log-probs and generated tokens differ in number."""
        for link in self.links:
            n_ids, n_lps = len(link.entry.generation_token_ids), len(link.entry.generation_log_probs)
            if n_ids != n_lps:
                raise ValueError(
                    f"log-prob/token length mismatch on {link.entry.model_call_id}: {n_lps} vs {n_ids}"
                )


@dataclass
class BuildNotes:
    """What a build kept, dropped and could not resolve (turned into run metrics)."""

    builder: str
    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    terminal_call_id: str | None = None
    terminal_chain: str = ""
    empty_generation_calls: list[str] = field(default_factory=list)
    parent_link_failures: dict[str, int] = field(default_factory=dict)
    unresolved_parent_calls: list[str] = field(default_factory=list)


@dataclass
class BuildOutput:
    """The chains (``main`` first when a terminal call anchors it), quarantined call ids, notes."""

    chains: list[Chain]
    quarantined: list[str] = field(default_factory=list)
    notes: BuildNotes = field(default_factory=lambda: BuildNotes(builder=""))


@dataclass(eq=False)
class _Node:
    entry: TokenEntry
    cumulative: list[int]
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    quarantined: bool = False
    unresolved_boundary: bool = False

    def path(self) -> list[_Node]:
        nodes: list[_Node] = []
        node: _Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


def _longest_extended(prompt: list[int], candidates: list[_Node]) -> tuple[_Node | None, bool]:
    """The candidate with the longest cumulative sequence ``prompt`` begins with (and whether tied)."""
    best: list[_Node] = []
    for node in candidates:
        n = len(node.cumulative)
        if n <= len(prompt) and prompt[:n] == node.cumulative:
            if not best or n > len(best[0].cumulative):
                best = [node]
            elif n == len(best[0].cumulative):
                best.append(node)
    return (best[0], len(best) > 1) if best else (None, False)


def _find_parent(
    node: _Node, by_id: dict[str, _Node], built: list[_Node]
) -> tuple[_Node | None, bool, str | None]:
    """(parent, ambiguous, note): the recorded link verified by digest, or why it was not used."""
    entry = node.entry
    prompt = list(entry.prompt_token_ids)
    if entry.parent_resolution == ParentResolutionStatus.ROOT:
        return None, False, None
    if entry.parent_resolution == ParentResolutionStatus.UNRESOLVED:
        return None, False, "parent_unresolved"
    if entry.parent_resolution != ParentResolutionStatus.RESOLVED and entry.parent_call_id is None:
        return None, False, "missing_resolution"
    if entry.parent_call_id is None:
        return None, False, "resolved_parent_missing_id"
    parent = by_id.get(entry.parent_call_id)
    if parent is None:
        inferred, ambiguous = _longest_extended(prompt, built)
        if inferred is not None and not ambiguous:
            return inferred, False, "parent_call_id_missing_recovered"
        return None, False, "parent_call_id_missing"
    cum_len = parent.entry.cum_len if parent.entry.cum_len is not None else len(parent.cumulative)
    expected = parent.entry.digest or compute_digest(parent.cumulative)
    if cum_len <= len(prompt) and compute_digest(prompt[:cum_len]) == expected:
        return parent, False, None
    return None, False, "parent_digest_mismatch"


def _full_prompts(entries: list[TokenEntry]) -> tuple[list[TokenEntry], list[str]]:
    """Delta entries rebuilt to full prompts through their parents; ids whose chain is broken."""
    by_id = {e.model_call_id: e for e in entries}
    cumulative: dict[str, list[int] | None] = {}

    def cumulative_of(call_id: str, depth: int = 0) -> list[int] | None:
        if call_id not in cumulative:
            entry = by_id.get(call_id)
            cumulative[call_id] = None  # a cycle reads None
            if entry is None or depth > 10_000:
                return None
            if not entry.prompt_is_delta:
                cumulative[call_id] = [*entry.prompt_token_ids, *entry.generation_token_ids]
            elif entry.parent_call_id is not None:
                parent = cumulative_of(entry.parent_call_id, depth + 1)
                if parent is not None:
                    cumulative[call_id] = [*parent, *entry.prompt_token_ids, *entry.generation_token_ids]
        return cumulative[call_id]

    full, broken = [], []
    for entry in entries:
        if not entry.prompt_is_delta:
            full.append(entry)
            continue
        sequence = cumulative_of(entry.model_call_id)
        if sequence is None or (entry.digest and compute_digest(sequence) != entry.digest):
            broken.append(entry.model_call_id)
            continue
        prompt = sequence[: len(sequence) - len(entry.generation_token_ids)]
        full.append(entry.model_copy(update={"prompt_token_ids": prompt, "prompt_is_delta": False}))
    return full, broken


def _count(notes: dict[str, int], key: str) -> None:
    notes[key] = notes.get(key, 0) + 1


def _chain(path: list[_Node]) -> Chain:
    chain = Chain(chain_id="", root_prompt=list(path[0].entry.prompt_token_ids))
    previous: list[int] = []
    for step, node in enumerate(path):
        prompt = list(node.entry.prompt_token_ids)
        chain.links.append(ChainLink(entry=node.entry, interstitial=prompt[len(previous) :] if step else []))
        previous = node.cumulative
    return chain


def prefix_merging(entries: list[TokenEntry], terminal_call_id: str | None = None) -> BuildOutput:
    """Chain a frozen snapshot's entries; ``terminal_call_id`` anchors which chain is ``main``."""
    failures: dict[str, int] = {}
    unresolved: list[str] = []
    unique: dict[str, TokenEntry] = {}
    for entry in entries:
        known = unique.setdefault(entry.model_call_id, entry)
        if known is not entry and (known.prompt_token_ids, known.generation_token_ids) != (
            entry.prompt_token_ids,
            entry.generation_token_ids,
        ):
            _count(failures, "duplicate_call_id_conflict")
            unresolved.append(entry.model_call_id)
    full, broken = _full_prompts(list(unique.values()))
    for call_id in broken:
        _count(failures, "delta_chain_unreconstructable")
        unresolved.append(call_id)
    empty = [e.model_call_id for e in full if not e.generation_token_ids]
    usable = sorted(
        (e for e in full if e.generation_token_ids), key=lambda e: (len(e.prompt_token_ids), e.model_call_id)
    )

    nodes: list[_Node] = []
    by_id: dict[str, _Node] = {}
    roots = 0
    quarantined: list[str] = []
    for entry in usable:
        node = _Node(entry=entry, cumulative=[*entry.prompt_token_ids, *entry.generation_token_ids])
        parent, ambiguous, note = _find_parent(node, by_id, nodes)
        if note:
            _count(failures, note)
            if not note.endswith("_recovered"):
                node.unresolved_boundary = True
                unresolved.append(entry.model_call_id)
        if parent is None:
            roots += 1
        else:
            node.parent = parent
            parent.children.append(node)
            if ambiguous:
                node.quarantined = True
                quarantined.append(entry.model_call_id)
        nodes.append(node)
        by_id[entry.model_call_id] = node

    terminal = by_id.get(terminal_call_id) if terminal_call_id else None
    on_terminal_path = set(map(id, terminal.path())) if terminal is not None else set()
    unresolved_retries = _quarantine_retries(nodes, on_terminal_path, terminal is not None, quarantined)

    terminal_status, terminal_chain = "", None
    if terminal_call_id:
        if terminal is None:
            terminal_status = "not_captured"
        elif any(n.quarantined or n.unresolved_boundary for n in terminal.path()):
            terminal_status = "broken"
        else:
            terminal_chain, terminal_status = _chain(terminal.path()), "delivered"
    chains = [] if terminal_chain is None else [terminal_chain]
    for leaf in (n for n in nodes if not n.children):
        path = leaf.path()
        if not any(n.quarantined for n in path) and not (terminal_chain is not None and terminal in path):
            chains.append(_chain(path))
    main = terminal_chain or (
        min(chains, key=lambda c: (c.links[0].entry.created_at, c.links[0].entry.model_call_id))
        if chains
        else None
    )
    branch = 0
    for chain in chains:
        if chain is main:
            chain.chain_id = "main"
        else:
            chain.chain_id, branch = f"branch-{branch}", branch + 1
    delivered = sum(len(link.entry.generation_token_ids) for link in main.links) if main is not None else 0
    captured = sum(len(e.generation_token_ids) for e in usable)
    notes = BuildNotes(
        builder="prefix_merging",
        roots=roots,
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        delivered_fraction=round(delivered / captured, 4) if captured else 0.0,
        unresolved_retries=unresolved_retries,
        terminal_call_id=terminal_call_id,
        terminal_chain=terminal_status,
        empty_generation_calls=empty,
        parent_link_failures=failures,
        unresolved_parent_calls=unresolved,
    )
    return BuildOutput(chains=chains, quarantined=quarantined, notes=notes)


def _quarantine_retries(
    nodes: list[_Node], on_terminal_path: set[int], anchored: bool, quarantined: list[str]
) -> list[str]:
    """Among siblings with the same prompt (retries), keep the one on the terminal path, else the
    ones that were continued, else the smallest id (then, unanchored, report them unresolved)."""
    unresolved: list[str] = []
    groups: dict[tuple[int, tuple[int, ...]], list[_Node]] = {}
    for node in nodes:
        groups.setdefault((id(node.parent), tuple(node.entry.prompt_token_ids)), []).append(node)
    for group in (g for g in groups.values() if len(g) > 1):
        keep = [n for n in group if id(n) in on_terminal_path] or [
            n for n in group if any(not c.quarantined for c in n.children)
        ]
        if not keep:
            keep = [min(group, key=lambda n: n.entry.model_call_id)]
            if not anchored:
                unresolved += [n.entry.model_call_id for n in group]
        for node in group:
            if node not in keep and not node.quarantined:
                node.quarantined = True
                quarantined.append(node.entry.model_call_id)
    return unresolved


_BUILDERS: dict[str, Callable[..., BuildOutput]] = {"prefix_merging": prefix_merging}


def run_builder(
    entries: list[TokenEntry], builder: str = "prefix_merging", terminal_call_id: str | None = None
) -> BuildOutput:
    """Chain snapshot entries with the named strategy (only ``prefix_merging`` exists)."""
    if builder not in _BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; known: {sorted(_BUILDERS)}")
    return _BUILDERS[builder](entries, terminal_call_id=terminal_call_id)


def project_chain_to_output_items(chain: Chain) -> list[dict[str, Any]]:
    """The chain as Responses output items: each call's content, its token-bearing item given
    the contiguous prompt (everything so far) and the call's generation."""
    items: list[dict[str, Any]] = []
    cumulative = list(chain.root_prompt)
    for step, link in enumerate(chain.links):
        if step:
            cumulative += link.interstitial
        entry = link.entry
        content = [dict(item) for item in entry.output_items]
        tokens: dict[str, Any] = {
            "prompt_token_ids": list(cumulative),
            "generation_token_ids": list(entry.generation_token_ids),
            "generation_log_probs": list(entry.generation_log_probs),
        }
        if entry.routed_experts is not None:
            tokens["routed_experts"] = entry.routed_experts
        if content:
            index = entry.token_item_index
            carrier = content[index] if index is not None and 0 <= index < len(content) else content[-1]
            carrier.update(tokens)
            items += content
        else:
            items.append({"type": "message", **tokens})
        cumulative += entry.generation_token_ids
    return items


def project_main_chain_response(rollout_id: str, out: BuildOutput, model: str = "") -> dict[str, Any]:
    """The main chain as a Responses object whose items' token fields form one unbroken sequence."""
    if not out.chains:
        raise ValueError("capture produced no safe trainable chain")
    main = next((c for c in out.chains if c.chain_id == "main"), out.chains[0])
    output = project_chain_to_output_items(main)
    generated = [item for item in output if item.get("generation_token_ids") is not None]
    if not any(item["generation_token_ids"] for item in generated):
        raise ValueError("capture produced no trainable generated tokens")
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {
            "input_tokens": len(generated[0]["prompt_token_ids"]),
            "output_tokens": sum(len(item["generation_token_ids"]) for item in generated),
        },
    }


def assert_prefix_contiguity(response: dict[str, Any]) -> None:
    """Raise ``AssertionError`` unless each generated item's prompt extends everything before it."""
    seen: list[int] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("generation_token_ids") is None:
            continue
        prompt = list(item.get("prompt_token_ids") or [])
        if prompt[: len(seen)] != seen:
            raise AssertionError(
                "projection is not prefix-contiguous: an output item's prompt_token_ids does not extend "
                "the tokens seen so far"
            )
        seen = prompt + list(item["generation_token_ids"])
