"""Compatibility: NeMo Gym's older path of the launch hooks (``nemo_gym.cli_setup_command``), now
``nemo_gym.cli.setup_command``: ``setup_env_command`` and ``run_command``, the same functions."""

from nemo_gym.launch.launch_hooks import run_command, setup_env_command

__all__ = ["run_command", "setup_env_command"]
