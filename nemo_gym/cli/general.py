"""NeMo Gym 0.7.0's ``nemo_gym.cli.general``: ``version`` and ``reinstall``."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(
    __name__, {"version": "nemo_gym.cli:ng_version", "reinstall": "nemo_gym.cli.legacy:main"}
)
