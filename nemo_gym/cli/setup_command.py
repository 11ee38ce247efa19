"""NeMo Gym 0.7.0's ``nemo_gym.cli.setup_command``: the launch hooks ``setup_env_command`` and ``run_command``.

The same functions as ``nemo_gym.cli.setup_env_command`` / ``run_command``; a trainer that
replaces them replaces them on ``nemo_gym.cli``, where each launch looks them up.
"""

from nemo_gym.launch.launch_hooks import run_command, setup_env_command

__all__ = ["run_command", "setup_env_command"]
