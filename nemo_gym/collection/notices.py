"""One-line notices of a collection run on stderr."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """A one-line notice on stderr (progress bars write there too)."""
    sys.stderr.write(f"[nemo_gym collect] {message}\n")
    sys.stderr.flush()
