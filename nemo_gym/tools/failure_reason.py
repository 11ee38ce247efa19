"""The one line that says why a ``gym env test`` / pytest run (or any Python command) failed.

Read from the command's output, in this order:

1. ``ng_test``'s own findings about the folder, ``[NAME] what is wrong`` (not its ``note:`` lines
   nor its closing ``[NAME] ok/FAILED: ...`` line), when the folder's ``NAME`` is given: a line of
   the tests' own output that starts with a bracket (a logger's ``[multistage-elo] ...``, a
   source line ``[`` of a list in a traceback) is not one of them;
2. a run cut by its time limit: ``timed out after N s``;
3. pytest's first error line of its first failure or collection error (``E   ValueError: ...``;
   a bare ``E   assert ...`` is an ``AssertionError``), which pytest does not cut short the way it
   cuts the short test summary to the terminal's width;
4. the short test summary's first ``FAILED test - reason`` / ``ERROR test - reason``;
5. the last line naming an exception (``KeyError: 'x'``, a plain traceback's last line);
6. the last line saying something failed, else the last line.
"""

from __future__ import annotations

import re

_LIMIT = 200
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit|Interrupt|Failed|Timeout)\b")
_PYTEST_ERROR = re.compile(r"^E\s+(\S.*)$")
_SUMMARY = re.compile(r"^(?:FAILED|ERROR) \S+ - (.+)$")
_TIMED_OUT = re.compile(r"^\[?(timed out after [^\]]+)\]?$")
_COMMAND_PREFIX = re.compile(r"^ng_\w+: ")


def _own_findings(lines: list[str], name: str) -> list[str]:
    prefix = f"[{name}] "
    return [
        line
        for line in lines
        if line.startswith(prefix) and not line[len(prefix) :].startswith(("note:", "ok:", "FAILED:"))
    ]


def failure_reason(output: str, name: str | None = None) -> str:
    """The line of ``output`` that says why the command failed (at most 200 characters; ``""``
    for empty output). ``name``: the folder ``ng_test`` checked, whose own findings come first."""
    lines = [
        line.rstrip()
        for line in output.splitlines()
        if line.strip() and not line.startswith("(run '") and ": on the index as " not in line
    ]
    if name:
        own = _own_findings(lines, name)
        if own:
            return own[0][:_LIMIT]
    for line in lines:
        timed_out = _TIMED_OUT.match(line.strip())
        if timed_out:
            return timed_out.group(1)[:_LIMIT]
    for line in lines:
        error = _PYTEST_ERROR.match(line)
        if error and _EXCEPTION.match(error.group(1)):
            return error.group(1)[:_LIMIT]
        if error and error.group(1).startswith("assert "):
            return f"AssertionError: {error.group(1)}"[:_LIMIT]
    for line in lines:
        summary = _SUMMARY.match(line)
        if summary:
            return summary.group(1)[:_LIMIT]
    plain = [_COMMAND_PREFIX.sub("", line.strip()) for line in lines]
    for line in reversed(plain):
        if _EXCEPTION.match(line):
            return line[:_LIMIT]
    for line in reversed(plain):
        if "FAILED" in line or "failed" in line:
            return line[:_LIMIT]
    return plain[-1][:_LIMIT] if plain else ""


__all__ = ["failure_reason"]
