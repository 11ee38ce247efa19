"""NeMo Gym 0.7.0's ``nemo_gym.cli.agents``: ``list_agents`` (``gym list agents``)."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(__name__, {"list_agents": "nemo_gym.tools.gym_cli:list_agents"})
