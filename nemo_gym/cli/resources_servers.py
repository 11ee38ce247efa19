"""NeMo Gym 0.7.0's ``nemo_gym.cli.resources_servers``: ``list_resources_servers``."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(
    __name__, {"list_resources_servers": "nemo_gym.tools.catalog_search:ng_list_resources_servers"}
)
