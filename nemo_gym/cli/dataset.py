"""NeMo Gym 0.7.0's ``nemo_gym.cli.dataset``: the dataset commands, at their 0.7.0 names."""

from nemo_gym.cli._names import names_from

__getattr__, __dir__ = names_from(
    __name__,
    {
        "prepare_data": "nemo_gym.tools.prepare_data:ng_prepare_data",
        "materialize_prompts_cli": "nemo_gym.tools.dataset_render:ng_materialize_prompts",
        "upload_jsonl_dataset_to_hf_cli": "nemo_gym.tools.dataset_remote:ng_upload_dataset_to_hf",
        "download_jsonl_dataset_from_hf_cli": "nemo_gym.tools.dataset_remote:ng_download_dataset_from_hf",
        "upload_jsonl_dataset_cli": "nemo_gym.tools.dataset_remote:ng_upload_dataset_to_gitlab",
        "download_jsonl_dataset_cli": "nemo_gym.tools.dataset_remote:ng_download_dataset_from_gitlab",
        "delete_jsonl_dataset_from_gitlab_cli": "nemo_gym.tools.dataset_remote:ng_delete_dataset_from_gitlab",
        "upload_jsonl_dataset_to_hf_and_delete_gitlab_cli": "nemo_gym.tools.dataset_remote:ng_gitlab_to_hf_dataset",
    },
)
