"""nemo_gym: run LLM agents in verifiable environments and collect rollouts for evaluation and RL.

Importing this package only defines things: no process starts, no socket opens and no config
is read until a command or a server starts.
"""

__version__ = "0.1.0"

from pathlib import Path as _Path

# NeMo Gym's names for the package's folder and the folder holding it (the project root, with
# resources_servers/, responses_api_models/, ...). verifiers finds bundled configs through PARENT_DIR.
ROOT_DIR = _Path(__file__).resolve().parent
PARENT_DIR = ROOT_DIR.parent
# Where NeMo Gym keeps downloads and run outputs: under the project root of a checkout, under the
# working directory otherwise (an installed package's parent is site-packages).
_WORKING_DIR = PARENT_DIR if (PARENT_DIR / "pyproject.toml").is_file() else _Path.cwd()
CACHE_DIR = _WORKING_DIR / "cache"
RESULTS_DIR = _WORKING_DIR / "results"


def _resolve_under_cwd_or_install(rel_path: "str | _Path") -> _Path:
    """A path to read: absolute as given; relative, under the first root where it exists: the
    ``NEMO_GYM_EXTRA_ROOTS`` folders (``os.pathsep``-separated), the working directory, the
    project root (``PARENT_DIR``, where the bundled servers live); else under the first of
    those (so an error names the user's own location)."""
    import os

    path = _Path(rel_path)
    if path.is_absolute():
        return path
    extra = [_Path(p) for p in os.environ.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if p]
    roots = [*extra, _Path.cwd(), PARENT_DIR]
    for root in roots:
        if (root / path).exists():
            return root / path
    return roots[0] / path
