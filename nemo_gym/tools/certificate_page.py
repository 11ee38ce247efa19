"""The HTML page of a harness certificate (``ng_certify_harness``): one self-contained file."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
.ok{color:#17692e;font-weight:600}.bad{color:#a4161a;font-weight:600}.split{color:#8a5a00;font-weight:600}
pre{background:#f5f5f5;padding:.4em;white-space:pre-wrap;margin:0}
"""


def _mark(ok: bool | None) -> str:
    if ok is None:
        return "<span>not checked</span>"
    return '<span class="ok">yes</span>' if ok else '<span class="bad">no</span>'


def render_page(report: dict[str, Any]) -> str:
    """The page: verdict, the checks, and per rollout its breaks and sequences."""
    e = html.escape
    verdict = report["verdict"]
    kind = "ok" if verdict == "token-exact" else "split" if verdict.startswith("token-exact") else "bad"
    parts = [
        f"<!doctype html><meta charset=utf-8><title>Certificate: {e(report['harness'])}</title>",
        f"<style>{_STYLE}</style>",
        f"<h1>{e(report['harness'])} on {e(report['engine'])}</h1>",
        f'<p>Verdict: <span class="{kind}">{e(verdict)}</span></p><table>',
        f"<tr><th>rollouts</th><td>{report['num_rollouts']}</td></tr>",
        f"<tr><th>prefix-stable rollouts</th><td>{report['prefix_stable_rollouts']}</td></tr>",
        f"<tr><th>sequences exported</th><td>{report['sequences_exported']}"
        f"{' (split at breaks)' if report['split'] else ''}</td></tr>",
        f"<tr><th>loss mask exact</th><td>{_mark(report['loss_mask_exact'])}</td></tr>",
        f"<tr><th>max |sampled - re-scored log-prob|</th><td>{e(str(report['max_logprob_diff']))} "
        f"(tolerance {report['logprob_tolerance']})</td></tr></table>",
    ]
    if report["break_causes"]:
        parts.append("<h2>Breaks by cause</h2><table>")
        parts += [f"<tr><td>{e(c)}</td><td>{n}</td></tr>" for c, n in report["break_causes"].items()]
        parts.append("</table>")
    for rollout in report["rollouts"]:
        parts.append(
            f"<h2>Rollout {rollout['index']}: reward {e(str(rollout['reward']))}, {rollout['num_calls']} calls, "
            f"passed {_mark(rollout['passed'])}</h2>"
        )
        if rollout.get("problem"):
            parts.append(f'<p class="bad">{e(rollout["problem"])}</p>')
        if rollout["breaks"]:
            parts.append(
                "<table><tr><th>call</th><th>tokens</th><th>cause</th><th>expected</th><th>got</th></tr>"
            )
            for b in rollout["breaks"]:
                parts.append(
                    f"<tr><td>{b['call']}</td><td>{b['token_range'][0]}..{b['token_range'][1]}</td>"
                    f"<td>{e(b['cause'])}</td><td><pre>{e(b['expected_text'])}</pre></td>"
                    f"<td><pre>{e(b['got_text'])}</pre></td></tr>"
                )
            parts.append("</table>")
        parts.append(
            "<table><tr><th>sequence calls</th><th>tokens</th><th>sampled</th><th>mask exact</th>"
            "<th>max log-prob diff</th><th>reproduced</th></tr>"
        )
        for s in rollout["sequences"]:
            parts.append(
                f"<tr><td>{', '.join(map(str, s['calls']))}</td><td>{s['num_tokens']}</td>"
                f"<td>{s['sampled_tokens']}</td><td>{_mark(s['loss_mask_exact'])}"
                f"{' ' + e(s['loss_mask_problem']) if s['loss_mask_problem'] else ''}</td>"
                f"<td>{e(str(s['max_logprob_diff']))}</td><td>{_mark(s['logprobs_reproduced'])}</td></tr>"
            )
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def write_page(report: dict[str, Any], path: Path) -> Path:
    """Write the page for ``report`` at ``path``; returns the path."""
    path.write_text(render_page(report), encoding="utf-8")
    return path
