"""Tools built on the public API: ``ng_test``, scaffolding, data preparation, re-verification,
benchmarks, the README's main job and the ``gym`` grouped command line."""
