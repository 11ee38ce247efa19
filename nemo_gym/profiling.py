"""Compatibility: NeMo Gym's ``nemo_gym.profiling``: a CPU profiler a server switches on around its work.

``Profiler(name=..., base_profile_dir=...)`` with ``start()``, ``stop()`` (which dumps) and
``dump()``. Unlike NeMo Gym's (yappi, a callgrind file and a call-graph PNG drawn by graphviz),
this one uses the standard library's ``cProfile``: it needs nothing installed and writes
``<name>.prof`` (``pstats``/snakeviz/gprof2dot read it) and ``<name>.log``, the functions by
cumulative time (only those whose line contains ``required_str`` when it is set).
"""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from pydantic import BaseModel, PrivateAttr, field_validator

__all__ = ["Profiler"]


class Profiler(BaseModel):
    """Profiles the calling thread between :meth:`start` and :meth:`stop` (one run per instance)."""

    name: str
    base_profile_dir: Path
    # Keep only the log lines that contain this (a package name, say) after the header.
    required_str: str | None = None
    _profile: cProfile.Profile | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _no_spaces(cls, name: str) -> str:
        if " " in name:
            raise ValueError(f"spaces are not allowed in a profiler name, got {name!r}")
        return name

    def start(self) -> None:
        """Start profiling."""
        self._profile = cProfile.Profile()
        self._profile.enable()

    def stop(self) -> None:
        """Stop profiling and write the files (:meth:`dump`)."""
        if self._profile is not None:
            self._profile.disable()
        self.dump()

    def dump(self) -> None:
        """Write ``<name>.prof`` and ``<name>.log`` under ``base_profile_dir`` (created if needed)."""
        if self._profile is None:
            raise RuntimeError(f"profiler {self.name!r} was never started")
        self.base_profile_dir.mkdir(parents=True, exist_ok=True)
        self._profile.dump_stats(self.base_profile_dir / f"{self.name}.prof")
        text = io.StringIO()
        pstats.Stats(self._profile, stream=text).sort_stats("cumulative").print_stats()
        lines = text.getvalue().splitlines(keepends=True)
        header_end = next(
            (i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), len(lines)
        )
        kept = lines[: header_end + 1] + [
            line for line in lines[header_end + 1 :] if not self.required_str or self.required_str in line
        ]
        (self.base_profile_dir / f"{self.name}.log").write_text("".join(kept))
