"""Config loading: `defaults:` inheritance, strict overrides, CLI parsing, validation and secret redaction."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field

from nemo_tau2.config import (
    REDACTED,
    ConfigError,
    apply_overrides,
    is_secret_key,
    load_config,
    load_config_from_cli,
    parse_args,
    parse_override_value,
    redact_secrets,
    validate_config,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def base_cfg(tmp_path: Path):
    path = write(
        tmp_path / "base.yaml",
        """
policy:
  model_name: tiny
  generation:
    temperature: 1.0
    top_p: 1.0
grpo:
  num_prompts_per_step: 4
  num_generations_per_prompt: 8
  batch: ${mul:${grpo.num_prompts_per_step},${grpo.num_generations_per_prompt}}
tags: [a, b]
""",
    )
    return load_config(path)


# ---------------------------------------------------------------- defaults inheritance


def test_child_overrides_parent_and_keeps_other_keys(tmp_path):
    write(tmp_path / "parent.yaml", "a: 1\nb: {x: 1, y: 2}\n")
    child = write(tmp_path / "child.yaml", "defaults: parent.yaml\nb: {y: 20}\nc: 3\n")
    cfg = load_config(child)
    assert OmegaConf.to_container(cfg) == {"a": 1, "b": {"x": 1, "y": 20}, "c": 3}


def test_later_defaults_win_and_parents_resolve_relative_to_their_own_file(tmp_path):
    write(tmp_path / "shared" / "root.yaml", "a: root\nb: root\nc: root\n")
    write(tmp_path / "shared" / "mid.yaml", "defaults: root.yaml\nb: mid\n")  # relative to shared/
    write(tmp_path / "other.yaml", "b: other\nc: other\n")
    child = write(tmp_path / "child.yaml", "defaults: [shared/mid.yaml, other.yaml]\nc: child\n")
    cfg = load_config(child)
    assert OmegaConf.to_container(cfg) == {"a": "root", "b": "other", "c": "child"}


def test_defaults_cycle_is_an_error_naming_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "defaults: b.yaml\nx: 1\n")
    write(tmp_path / "b.yaml", "defaults: a.yaml\ny: 1\n")
    with pytest.raises(ConfigError, match=r"cycle in config 'defaults': .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(tmp_path / "a.yaml")


def test_self_reference_is_a_cycle(tmp_path):
    write(tmp_path / "a.yaml", "defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_missing_parent_names_the_path(tmp_path):
    child = write(tmp_path / "child.yaml", "defaults: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"'defaults' entry 'nowhere.yaml' in .*child.yaml not found"):
        load_config(child)
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_malformed_defaults_and_top_level_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="'defaults' in .* must be a path or a list of paths"):
        load_config(write(tmp_path / "bad.yaml", "defaults: {a: 1}\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path / "list.yaml", "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(write(tmp_path / "syntax.yaml", "a: [1, 2\n"))


def test_incompatible_merge_names_the_file(tmp_path):
    write(tmp_path / "parent.yaml", "a: {b: 1}\n")
    child = write(tmp_path / "child.yaml", "defaults: parent.yaml\na: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"cannot merge .*child\.yaml over its defaults"):
        load_config(child)


def test_interpolations_resolve_after_inheritance_and_overrides(tmp_path):
    write(tmp_path / "parent.yaml", "n: 4\nk: 8\nbatch: ${mul:${n},${k}}\n")
    child = write(tmp_path / "child.yaml", "defaults: parent.yaml\nk: 2\n")
    cfg = apply_overrides(load_config(child), ["n=5"])
    assert cfg.batch == 10


def test_resolvers_add_div_max(base_cfg):
    cfg = apply_overrides(
        base_cfg, ["+r.add=${add:1,2,3}", "+r.div=${div:3,4}", "+r.max=${max:2,7,5}", "+r.mul=${mul:2,3,4}"]
    )
    assert OmegaConf.to_container(cfg.r, resolve=True) == {"add": 6, "div": 0.75, "max": 7, "mul": 24}


def test_div_by_zero_is_a_clear_error(base_cfg):
    cfg = apply_overrides(base_cfg, ["+r=${div:1,0}"])
    with pytest.raises(ConfigError, match="divides by zero"):
        validate_config(cfg, type("Any", (BaseModel,), {"__annotations__": {"r": float}}))


# ---------------------------------------------------------------- overrides


def test_override_of_known_key(base_cfg):
    cfg = apply_overrides(base_cfg, ["policy.generation.temperature=0.7", "grpo.num_prompts_per_step=2"])
    assert cfg.policy.generation.temperature == 0.7
    assert cfg.grpo.batch == 16
    assert base_cfg.policy.generation.temperature == 1.0  # the input config is not mutated


def test_unknown_key_is_rejected_with_closest_key_and_full_path(base_cfg):
    with pytest.raises(ConfigError) as err:
        apply_overrides(base_cfg, ["policy.generaton.temperature=0.7"])
    message = str(err.value)
    assert "unknown config key 'policy.generaton.temperature'" in message
    assert "policy.generation.temperature" in message
    assert "+policy.generaton.temperature=" in message


def test_unknown_key_without_similar_key_says_so(base_cfg):
    with pytest.raises(ConfigError, match="no similar key exists"):
        apply_overrides(base_cfg, ["zzzzzz=1"])


def test_plus_adds_new_nested_key(base_cfg):
    cfg = apply_overrides(base_cfg, ["+logger.wandb.project=tau2", "+policy.generation.top_k=20"])
    assert cfg.logger.wandb.project == "tau2"
    assert cfg.policy.generation.top_k == 20


def test_plus_on_existing_key_is_rejected(base_cfg):
    with pytest.raises(ConfigError, match="cannot add config key 'policy.model_name': it already exists"):
        apply_overrides(base_cfg, ["+policy.model_name=big"])


def test_double_plus_adds_or_replaces(base_cfg):
    cfg = apply_overrides(base_cfg, ["++policy.model_name=big", "++new.key=1"])
    assert cfg.policy.model_name == "big"
    assert cfg.new.key == 1


def test_override_values_parse_like_yaml(base_cfg):
    cfg = apply_overrides(
        base_cfg,
        ["tags=[1,2,4]", "policy.model_name=null", "+flag=true", "+lr=1e-6", "+name=Qwen/Qwen3-4B", "+empty="],
    )
    assert list(cfg.tags) == [1, 2, 4]
    assert cfg.policy.model_name is None
    assert cfg.flag is True
    assert cfg.lr == pytest.approx(1e-6) and isinstance(cfg.lr, float)
    assert cfg.name == "Qwen/Qwen3-4B"
    assert cfg.empty == ""


def test_override_replaces_a_whole_mapping(base_cfg):
    cfg = apply_overrides(base_cfg, ["policy.generation={temperature: 0.5}"])
    assert OmegaConf.to_container(cfg.policy.generation) == {"temperature": 0.5}


def test_override_list_element_by_index(base_cfg):
    cfg = apply_overrides(base_cfg, ["tags.1=z"])
    assert list(cfg.tags) == ["a", "z"]
    with pytest.raises(ConfigError, match="unknown config key 'tags.5'"):
        apply_overrides(base_cfg, ["tags.5=z"])


def test_override_can_target_a_missing_mandatory_value(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", "policy:\n  model_name: ???\n"))
    assert apply_overrides(cfg, ["policy.model_name=tiny"]).policy.model_name == "tiny"


def test_malformed_override_is_rejected(base_cfg):
    for bad in ["policy.model_name", "=1", "+++a=1", "a..b=1"]:
        with pytest.raises(ConfigError, match="malformed override"):
            apply_overrides(base_cfg, [bad])


def test_adding_a_key_under_a_scalar_is_rejected(base_cfg):
    for override in ["+policy.model_name.sub=1", "++policy.model_name.sub=1", "policy.model_name.sub=1"]:
        with pytest.raises(ConfigError, match=r"cannot set 'policy.model_name.sub': 'policy.model_name' holds a"):
            apply_overrides(base_cfg, [override])


def test_parse_override_value_keeps_interpolations_as_strings():
    assert parse_override_value("${a.b}") == "${a.b}"
    assert parse_override_value("-3") == -3
    assert parse_override_value("'007'") == "007"


# ---------------------------------------------------------------- command line


def test_parse_args_reads_config_and_overrides(tmp_path):
    args = parse_args(["--config", "x.yaml", "a.b=1", "+c=2", "++d=3"])
    assert args.config == Path("x.yaml")
    assert args.overrides == ["a.b=1", "+c=2", "++d=3"]
    assert parse_args(["--config=y.yaml"]).config == Path("y.yaml")


def test_parse_args_uses_default_config():
    assert parse_args(["a=1"], default_config="examples/configs/x.yaml").config == Path("examples/configs/x.yaml")


@pytest.mark.parametrize(
    "argv", [["--config", "x.yaml", "--lr", "1"], ["--config", "x.yaml", "bareword"], ["--conf", "x.yaml"], []]
)
def test_parse_args_rejects_unknown_flags_and_words(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_load_config_from_cli_applies_overrides_in_order(tmp_path):
    path = write(tmp_path / "c.yaml", "a: {b: 1}\n")
    cfg = load_config_from_cli(["--config", str(path), "a.b=2", "++a.b=3", "+a.c=4"])
    assert OmegaConf.to_container(cfg) == {"a": {"b": 3, "c": 4}}


# ---------------------------------------------------------------- validation


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(ge=0.0)
    top_p: float = 1.0


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_name: str
    generation: GenerationConfig
    api_key: str | None = None


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_prompts_per_step: int
    num_generations_per_prompt: int
    batch: int


class MasterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: PolicyConfig
    grpo: GRPOConfig
    tags: list[str]


def test_validate_config_resolves_interpolations(base_cfg):
    cfg = validate_config(base_cfg, MasterConfig)
    assert cfg.grpo.batch == 32
    assert cfg.policy.generation.temperature == 1.0


def test_validation_error_names_dotted_key_and_bad_value(base_cfg):
    cfg = apply_overrides(base_cfg, ["policy.generation.temperature=hot", "grpo.num_prompts_per_step=-1.5"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, MasterConfig)
    message = str(err.value)
    assert "policy.generation.temperature: Input should be a valid number" in message
    assert "'hot'" in message
    assert "grpo.num_prompts_per_step" in message and "-1.5" in message


def test_validation_error_suggests_field_for_unknown_key(base_cfg):
    cfg = apply_overrides(base_cfg, ["+policy.generation.temprature=0.5"])
    with pytest.raises(ConfigError, match=r"policy\.generation\.temprature: unknown key; did you mean 'temperature'"):
        validate_config(cfg, MasterConfig)


def test_validation_error_names_missing_key_and_missing_mandatory_value(tmp_path, base_cfg):
    cfg = OmegaConf.masked_copy(base_cfg, ["grpo", "tags"])
    with pytest.raises(ConfigError, match="policy: required key is missing"):
        validate_config(cfg, MasterConfig)
    cfg = apply_overrides(base_cfg, ["policy.model_name=???"])
    with pytest.raises(ConfigError, match=r"cannot resolve config: .*model_name"):
        validate_config(cfg, MasterConfig)


def test_validation_error_never_echoes_a_secret(base_cfg):
    cfg = apply_overrides(base_cfg, ["+policy.api_key=[sk-very-secret]"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, MasterConfig)
    assert "policy.api_key" in str(err.value)
    assert "sk-very-secret" not in str(err.value)


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "key",
    ["api_key", "openai_api_key", "apiKey", "token", "hf_token", "auth_token", "password", "client_secret",
     "secret_key", "private_key", "access_key", "credentials"],
)  # fmt: skip
def test_secret_keys_are_detected(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["api_key_env", "token_env", "hf_token_env_var", "max_tokens", "max_new_tokens", "stop_token_ids",
     "generation_token_ids", "pad_token", "eos_token", "token_level_loss", "tokenizer", "key", "max_token",
     "num_tokens", "model_name"],
)  # fmt: skip
def test_non_secret_keys_are_kept(key):
    assert not is_secret_key(key)


def test_redact_secrets_replaces_secret_values_everywhere(tmp_path):
    cfg = load_config(
        write(
            tmp_path / "c.yaml",
            """
user_model: {api_key: sk-123, api_key_env: OPENAI_API_KEY, max_tokens: 256}
servers:
  - {name: a, token: t-1, stop_token_ids: [1, 2]}
  - {name: b, token: null}
logger: {wandb: {password: hunter2, project: p}}
base_url: ${user_model.max_tokens}
""",
        )
    )
    redacted = redact_secrets(cfg)
    assert redacted == {
        "user_model": {"api_key": REDACTED, "api_key_env": "OPENAI_API_KEY", "max_tokens": 256},
        "servers": [{"name": "a", "token": REDACTED, "stop_token_ids": [1, 2]}, {"name": "b", "token": None}],
        "logger": {"wandb": {"password": REDACTED, "project": "p"}},
        "base_url": 256,
    }
    text = json.dumps(redacted)
    assert "sk-123" not in text and "t-1" not in text and "hunter2" not in text
    assert cfg.user_model.api_key == "sk-123"  # the config itself is untouched
