"""A web viewer for rollout collections: ``ng_viewer +input=<rollouts.jsonl>``.

- :mod:`nemo_gym.viewer.index`: the offset index kept beside a rollouts file (``.ngindex``);
- :mod:`nemo_gym.viewer.collection`: per-task statistics and the pages' data;
- :mod:`nemo_gym.viewer.tokens`: the Tokens page (training sequences as the trainer sees them);
- :mod:`nemo_gym.viewer.app`: the starlette app, its auth, and the ``ng_viewer`` command;
- ``static/``: the page (HTML, JS, CSS; no CDN; plots drawn as inline SVG).
"""
