"""NeMo Gym's trainer-facing names: the pieces tests/clients/ does not already pin down."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest
from omegaconf import DictConfig

from nemo_gym.launch.launcher import StackError, StackHandle, free_port
from nemo_gym.rollout_collection import RolloutFailedError
from nemo_gym.serving.server import bind_socket_in_range


def test_trainer_names_import_from_nemo_gym_paths() -> None:
    import nemo_gym
    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper, run_command, setup_env_command
    from nemo_gym.config_types import BaseServerConfig, ModelServerRef
    from nemo_gym.global_config import GlobalConfigDictParserConfig as FromGlobalConfig
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, ServerClient

    assert (nemo_gym.PARENT_DIR / "resources_servers").is_dir()
    assert GlobalConfigDictParserConfig is FromGlobalConfig and HEAD_SERVER_KEY_NAME == "head_server"
    assert callable(run_command) and callable(setup_env_command) and RunHelper().shutdown() is None
    assert BaseServerConfig(host="10.0.0.1", port=5).port == 5
    assert ModelServerRef(name="policy_model").type == "responses_api_models"
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=9), global_config_dict={}
    )
    assert client.head_url == "http://127.0.0.1:9"


def test_rollout_error_pickles_with_status() -> None:
    row = {"responses_create_params": {"input": "hi"}, "_rowidx": 3}
    for error, status in [
        (RolloutFailedError(row, "agent_error", "HTTP 422: bad input", 422), 422),
        (RolloutFailedError(row, "timeout", "no answer"), 504),
        (RolloutFailedError(row, "unreachable", "refused"), 503),
        (RolloutFailedError(row, "judge_failed", "judge down"), 502),
    ]:
        copy = pickle.loads(pickle.dumps(error))
        assert (copy.status, copy.failure_class, copy.row, str(copy)) == (
            status,
            error.failure_class,
            row,
            str(error),
        )


def test_initial_config_wins_over_files_and_dotenv(tmp_path) -> None:
    from nemo_gym.global_config import GlobalConfigDictParserConfig

    env = tmp_path / "trainer_env.yaml"
    env.write_text("policy_model_name: from-env\npolicy_api_key: from-env\n")
    initial = DictConfig(
        {
            "config_paths": ["responses_api_models/scripted_model/configs/scripted_model.yaml"],
            "policy_model": {"responses_api_models": {"scripted_model": {"entrypoint": "other.py"}}},
            "policy_model_name": "from-trainer",
        }
    )
    config = GlobalConfigDictParserConfig(
        dotenv_path=env, initial_global_config_dict=initial, skip_load_from_cli=True
    ).load()
    assert config["policy_model"]["responses_api_models"]["scripted_model"]["entrypoint"] == "other.py"
    assert (config["policy_model_name"], config["policy_api_key"]) == ("from-trainer", "from-env")
    skipped = GlobalConfigDictParserConfig(
        dotenv_path=env,
        initial_global_config_dict=initial,
        skip_load_from_cli=True,
        skip_load_from_dotenv=True,
    ).load()
    assert "policy_api_key" not in skipped


def test_port_range_binding_stays_in_range() -> None:
    port = free_port()
    with bind_socket_in_range("127.0.0.1", port, port) as sock:
        assert sock.getsockname()[1] == port
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in the range \\[{port}, {port}\\]"):
            bind_socket_in_range("127.0.0.1", port, port)


def test_unlaunched_instance_needs_host_and_port() -> None:
    config = {
        "head_server": {"port": 0},
        "policy_model": {"responses_api_models": {"proxy": {"entrypoint": "missing.py"}}},
    }

    def no_process_hooks():
        from nemo_gym.launch.launch_hooks import LaunchHooks

        return LaunchHooks(setup_env_command=lambda *a: "true", run_command=lambda *a: object())

    from nemo_gym.launch.config import ConfigError
    from nemo_gym.launch.server_processes import LocalProcessBackend

    with pytest.raises(ConfigError, match="'policy_model': its launch started no process.*host and port"):
        StackHandle.start(config, backend=LocalProcessBackend(no_process_hooks()))
    with pytest.raises(ConfigError, match="'policy_model': entrypoint .*missing.py.* not found"):
        StackHandle.start(config)
    assert issubclass(StackError, RuntimeError)


@pytest.mark.parametrize("closing", ["async with", "dropped"])
def test_helper_leaves_no_unclosed_session(closing: str) -> None:
    # "dropped": trainers (NeMo RL, verl, verifiers) never close the helper; it must not warn either.
    body = (
        "async with RolloutCollectionHelper() as helper:"
        if closing == "async with"
        else "helper = RolloutCollectionHelper()\n    if True:"
    )
    code = textwrap.dedent(
        """
        import asyncio
        from nemo_gym.rollout_collection import RolloutCollectionHelper

        async def main():
            BODY
                for future in helper.run_examples([{"agent_ref": {"name": "nobody"}}], {"host": "127.0.0.1", "port": 9}):
                    try:
                        await future
                    except Exception as exc:
                        print(type(exc).__name__, exc.status)

        asyncio.run(main())
        """
    ).replace("BODY", body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RolloutFailedError", "503"]
    assert "Unclosed" not in done.stderr and "never awaited" not in done.stderr, done.stderr
