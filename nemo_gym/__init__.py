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
