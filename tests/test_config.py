"""Config composition, overrides, interpolation, server refs and redaction."""

from pathlib import Path

import pytest

from nemo_gym.launch.config import (
    REDACTED,
    ConfigError,
    dump_yaml,
    load_config,
    parse_overrides,
    redact,
    server_instances,
)

AGENT = """
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: my_env}
      model_server: {type: responses_api_models, name: policy_model}
"""
ENV = """
my_env:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
"""
MODEL = """
policy_model:
  responses_api_models:
    vllm_model:
      base_url: ${policy_base_url}
      api_key: ${policy_api_key}
      model: ${policy_model_name}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_parse_overrides_modes_and_values():
    parsed = parse_overrides(
        ["a.b=1", "+c=[x.yaml,y.yaml]", "++d={temperature: 0.5}", "+e=hello world", "+f="]
    )
    assert [(o.path, o.value, o.mode) for o in parsed] == [
        ("a.b", 1, ""),
        ("c", ["x.yaml", "y.yaml"], "+"),
        ("d", {"temperature": 0.5}, "++"),
        ("e", "hello world", "+"),
        ("f", "", "+"),
    ]
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["novalue"])
    with pytest.raises(ConfigError, match="empty key"):
        parse_overrides(["a..b=1"])


def test_compose_files_env_yaml_and_interpolation(tmp_path: Path):
    paths = [
        write(tmp_path, "agent.yaml", AGENT),
        write(tmp_path, "env.yaml.src", ENV),
        write(tmp_path, "model.yaml", MODEL),
    ]
    (tmp_path / "env.yaml").write_text(
        "policy_base_url: http://127.0.0.1:8000/v1\npolicy_api_key: sk-abc\npolicy_model_name: tiny\n"
    )
    config = load_config(
        [f"+config_paths=[{','.join(paths)}]", "++my_agent.responses_api_agents.simple_agent.max_steps=3"],
        cwd=tmp_path,
    )
    model_fields = config["policy_model"]["responses_api_models"]["vllm_model"]
    assert model_fields == {"base_url": "http://127.0.0.1:8000/v1", "api_key": "sk-abc", "model": "tiny"}
    assert config["my_agent"]["responses_api_agents"]["simple_agent"]["max_steps"] == 3
    instances = server_instances(config)
    assert {i.name: (i.type, i.impl) for i in instances.values()} == {
        "my_agent": ("responses_api_agents", "simple_agent"),
        "my_env": ("resources_servers", "example_single_tool_call"),
        "policy_model": ("responses_api_models", "vllm_model"),
    }
    # Secrets are redacted wherever the config is shown.
    dumped = dump_yaml(config)
    assert "sk-abc" not in dumped and REDACTED in dumped


def test_later_override_wins_and_plain_override_needs_existing_key(tmp_path: Path):
    paths = write(tmp_path, "env.yaml.src", ENV)
    config = load_config([f"+config_paths=[{paths}]", "+limit=5", "++limit=7"], cwd=tmp_path)
    assert config["limit"] == 7
    with pytest.raises(ConfigError, match="did you mean 'limit'"):
        load_config([f"+config_paths=[{paths}]", "+limit=5", "limt=3"], cwd=tmp_path)


def test_unknown_server_ref_suggests_the_close_name(tmp_path: Path):
    paths = [
        write(tmp_path, "a.yaml", AGENT.replace("name: policy_model", "name: policy_modle")),
        write(tmp_path, "b.yaml", ENV),
    ]
    paths.append(
        write(
            tmp_path,
            "c.yaml",
            MODEL.replace("${policy_base_url}", "x")
            .replace("${policy_api_key}", "y")
            .replace("${policy_model_name}", "z"),
        )
    )
    with pytest.raises(ConfigError) as info:
        load_config([f"+config_paths=[{','.join(paths)}]"], cwd=tmp_path)
    assert "'policy_modle'" in str(info.value) and "did you mean 'policy_model'" in str(info.value)


def test_missing_interpolation_and_missing_file_name_the_culprit(tmp_path: Path):
    path = write(tmp_path, "m.yaml", MODEL)
    with pytest.raises(ConfigError, match="policy_base_url"):
        load_config([f"+config_paths=[{path}]"], cwd=tmp_path)
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(["+config_paths=[nope.yaml]"], cwd=tmp_path)


def test_a_missing_config_file_gets_a_did_you_mean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"did you mean 'resources_servers/mcqa/configs/mcqa\.yaml'\?"):
        load_config(["+config_paths=[resources_servers/mcqa/configs/mcq.yaml]"], cwd=tmp_path)
    mine = write(tmp_path, "my_model.yaml", MODEL)
    with pytest.raises(ConfigError, match=f"did you mean '{mine}'"):
        load_config([f"+config_paths=[{tmp_path / 'my_modle.yaml'}]"], cwd=tmp_path)
    with pytest.raises(ConfigError) as far:
        load_config(["+config_paths=[zzz/qqq.yaml]"], cwd=tmp_path)
    assert "did you mean" not in str(far.value)


def test_redaction_keeps_numbers_and_flags():
    config = {
        "openai_api_key": "sk-1",
        "hf_token": "t",
        "db_password": "p",
        "max_tokens": 100,
        "return_token_id_information": True,
        "nested": [{"client_secret": "s"}],
    }
    assert redact(config) == {
        "openai_api_key": REDACTED,
        "hf_token": REDACTED,
        "db_password": REDACTED,
        "max_tokens": 100,
        "return_token_id_information": True,
        "nested": [{"client_secret": REDACTED}],
    }


def test_bundled_example_configs_compose():
    config = load_config(
        [
            "+config_paths=[resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml,"
            "responses_api_models/scripted_model/configs/scripted_model.yaml]"
        ]
    )
    assert set(server_instances(config)) == {
        "example_single_tool_call",
        "example_single_tool_call_simple_agent",
        "policy_model",
    }


def test_config_files_include_their_own_config_paths(tmp_path: Path):
    write(tmp_path, "env_base.yaml", ENV)
    overlay = write(
        tmp_path,
        "overlay.yaml",
        "config_paths: [env_base.yaml]\nmy_env:\n  resources_servers:\n    example_single_tool_call:\n      domain: math\n",
    )
    config = load_config([f"+config_paths=[{overlay}]"], cwd=tmp_path)
    assert config["my_env"]["resources_servers"]["example_single_tool_call"] == {
        "entrypoint": "app.py",
        "domain": "math",
    }
    loop_a = write(tmp_path, "a.yaml", "config_paths: [b.yaml]\n")
    write(tmp_path, "b.yaml", "config_paths: [a.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config([f"+config_paths=[{loop_a}]"], cwd=tmp_path)


def test_ref_validation_can_be_skipped_for_data_commands(tmp_path: Path):
    path = write(tmp_path, "agent.yaml", AGENT)
    with pytest.raises(ConfigError, match="not found"):
        load_config([f"+config_paths=[{path}]"], cwd=tmp_path)
    assert "my_agent" in load_config([f"+config_paths=[{path}]"], cwd=tmp_path, validate_refs=False)


def test_one_instance_name_with_two_kinds_in_two_files_is_an_error_naming_the_clash(tmp_path: Path):
    first = tmp_path / "a.yaml"
    first.write_text(
        "shared_name:\n  resources_servers:\n    example_single_tool_call:\n      entrypoint: app.py\n"
    )
    second = tmp_path / "b.yaml"
    second.write_text(
        "shared_name:\n  responses_api_models:\n    scripted_model:\n      entrypoint: app.py\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config([f"+config_paths=[{first},{second}]"], cwd=tmp_path, validate_refs=False)
    message = str(caught.value)
    assert "'shared_name'" in message and "resources_servers" in message and "responses_api_models" in message
    assert str(first) in message and str(second) in message
    # Merged some other way (a trainer's dict), the instance with two kinds is an error too.
    from nemo_gym.launch.config import server_instances

    both = {"shared_name": {"resources_servers": {"a": {}}, "responses_api_models": {"b": {}}}}
    with pytest.raises(ConfigError, match="more than one server kind"):
        server_instances(both)


def test_inherit_from_copies_an_instance_under_a_new_name(tmp_path: Path) -> None:
    """NeMo Gym's ``_inherit_from``: a benchmark's instance is the named one with its keys over it."""
    from nemo_gym.launch.config import ConfigError, resolve_inheritance

    base = {
        "env": {"resources_servers": {"impl": {"entrypoint": "app.py", "judge": {"name": "j", "t": 1}}}},
        "bench_env": {"_inherit_from": "env", "resources_servers": {"impl": {"judge": {"t": 2}}}},
        "bench_env2": {"_inherit_from": "bench_env", "resources_servers": {"impl": {"extra": True}}},
    }
    out = resolve_inheritance(base)
    assert out["bench_env"] == {
        "resources_servers": {"impl": {"entrypoint": "app.py", "judge": {"name": "j", "t": 2}}}
    }
    assert out["bench_env2"]["resources_servers"]["impl"] == {
        "entrypoint": "app.py",
        "judge": {"name": "j", "t": 2},
        "extra": True,
    }
    assert base["env"]["resources_servers"]["impl"]["judge"]["t"] == 1  # the parent is not changed
    with pytest.raises(ConfigError, match="no instance 'evn'.*did you mean 'env'"):
        resolve_inheritance({"env": {}, "b": {"_inherit_from": "evn"}})
    with pytest.raises(ConfigError, match="cycle"):
        resolve_inheritance({"a": {"_inherit_from": "b"}, "b": {"_inherit_from": "a"}})
