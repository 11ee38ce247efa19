"""A web viewer for rollout collections: ``ng_viewer +input=<rollouts.jsonl>``.

- :mod:`nemo_gym.viewer.index`: the offset index kept beside a rollouts file (``.ngindex``);
- :mod:`nemo_gym.viewer.collection`: per-task statistics and the pages' data (the Overview's
  charts in :mod:`nemo_gym.viewer.charts`, the Compare page in :mod:`nemo_gym.viewer.compare`);
- :mod:`nemo_gym.viewer.tokens`: the Tokens page (training sequences as the trainer sees them);
- :mod:`nemo_gym.viewer.app`: the starlette app, its auth, and the ``ng_viewer`` command;
- ``static/``: the page (HTML, JS, CSS; no CDN; plots drawn as inline SVG).
"""

from typing import Any

__all__ = ["ng_viewer"]


def __getattr__(name: str) -> Any:
    # ``gym view`` and the console script reach ng_viewer here; the web stack loads only then.
    if name == "ng_viewer":
        from nemo_gym.viewer.app import ng_viewer

        return ng_viewer
    raise AttributeError(f"module 'nemo_gym.viewer' has no attribute {name!r}")
