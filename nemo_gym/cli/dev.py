"""NeMo Gym 0.7.0's ``nemo_gym.cli.dev``: ``dev_test`` (``gym dev test``)."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(__name__, {"dev_test": "nemo_gym.tools.dev_test:ng_dev_test"})
