"""NeMo Gym 0.7.0's ``nemo_gym.cli.eval``: the evaluation commands, at their 0.7.0 names."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(
    __name__,
    {
        "e2e_rollout_collection": "nemo_gym.rollout_collection:ng_e2e_collect_rollouts",
        "collect_rollouts": "nemo_gym.rollout_collection:ng_collect_rollouts",
        "aggregate_rollouts": "nemo_gym.rollout_collection:ng_aggregate_rollouts",
        "reward_profile": "nemo_gym.reward_profile:ng_reward_profile",
        "reverify_rollouts": "nemo_gym.tools.reverify:ng_reverify_rollouts",
        "prepare_benchmark": "nemo_gym.tools.benchmarks:ng_prepare_benchmark",
        "list_benchmarks": "nemo_gym.tools.benchmarks:ng_list_benchmarks",
        "compare": "nemo_gym.tools.compare_runs:ng_compare_runs",
        "health_check_rollouts": "nemo_gym.rollout_health:health_check_run_dir",
        "export_rollouts_as_atif": "nemo_gym.tools.atif_export:ng_export_atif",
    },
)
