"""NeMo Gym 0.7.0's ``nemo_gym.cli.env``: the environment commands, at their 0.7.0 names.

Each name is this project's command (a console script taking an optional argument list;
without one it reads ``sys.argv`` as NeMo Gym's does), resolved when first used.
"""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(
    __name__,
    {
        "RunHelper": "nemo_gym.cli:RunHelper",
        "run": "nemo_gym.cli:ng_run",
        "status": "nemo_gym.cli:ng_status",
        "dump_config": "nemo_gym.cli:ng_dump_config",
        "test": "nemo_gym.tools.authoring:ng_test",
        "test_all": "nemo_gym.tools.authoring:ng_test",
        "init_resources_server": "nemo_gym.tools.scaffold:ng_init_resources_server",
        "list_environments": "nemo_gym.tools.gym_cli:list_environments",
        "validate": "nemo_gym.tools.env_validate:ng_validate",
        "pip_list": "nemo_gym.tools.env_packages:ng_pip_list",
        "PipListConfig": "nemo_gym.tools.env_packages:PackagesSettings",
        "show_schema": "nemo_gym.tools.env_schema:ng_env_schema",
        "SchemaConfig": "nemo_gym.tools.env_schema:SchemaSettings",
    },
)
