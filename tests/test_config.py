"""Config discovery, resolution order and one-line errors that name the key path and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conclave.core.errors import ConfigError
from conclave.schema.config import load_config
from conclave.schema.schemas import data_path

Write = Callable[..., Path]
MINIMAL: dict[str, Any] = {
    "providers": {
        "a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1", "api_key_env": "A_KEY"}
    },
    "panel": ["a"],
}


def error_of(*args: Any, **kwargs: Any) -> str:
    kwargs.setdefault("env", {})
    kwargs.setdefault("dotenv", None)
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "config errors are one line"
    return message


def test_packaged_default_config_is_valid_and_has_every_preset() -> None:
    config = load_config(str(data_path("config.yaml")), env={}, dotenv=None)
    assert set(config.providers) == {
        "openai",
        "anthropic",
        "gemini",
        "xai",
        "mistral",
        "groq",
        "deepseek",
        "openrouter",
        "ollama",
        "llamacpp",
    }
    assert config.providers["ollama"].api_key_env is None
    assert config.providers["ollama"].base_url == "http://127.0.0.1:11434/v1"
    assert config.providers["ollama"].price is None
    llamacpp = config.providers["llamacpp"]
    assert (llamacpp.api_key_env, llamacpp.price, llamacpp.tool_mode) == (None, None, "tags")
    assert llamacpp.base_url == "http://127.0.0.1:8080/v1" and llamacpp.prompt_cache_key is False
    assert config.providers["anthropic"].price is not None
    assert config.providers["anthropic"].price.cache_write_per_mtok == 3.75
    assert config.panel == ("openai", "anthropic", "gemini")


def test_missing_file_named_by_flag_says_which_and_how_to_fix(tmp_path: Path) -> None:
    message = error_of(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in message
    assert "--config" in message


def test_missing_file_named_by_environment_says_so(tmp_path: Path) -> None:
    message = error_of(None, env={"CONCLAVE_CONFIG": str(tmp_path / "gone.yaml")})
    assert "CONCLAVE_CONFIG" in message


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("panel: [a, b\nlimits: {", encoding="utf-8")
    message = error_of(str(path))
    assert "line" in message
    assert "YAML" in message


def test_unknown_key_names_its_path_and_what_is_allowed(write_config: Write) -> None:
    message = error_of(str(write_config({**MINIMAL, "limits": {"timeout": 5}})))
    assert message.startswith("config: limits:")
    assert "'timeout'" in message
    assert "timeout_seconds" in message
    assert "remove it" in message


def test_unknown_top_level_section_is_rejected(write_config: Write) -> None:
    message = error_of(str(write_config({**MINIMAL, "panle": ["a"]})))
    assert "'panle'" in message


def test_wrong_type_names_the_path_and_the_expected_type(write_config: Write) -> None:
    message = error_of(str(write_config({**MINIMAL, "breakers": {"failure_threshold": "five"}})))
    assert message.startswith("config: breakers.failure_threshold:")
    assert "'integer'" in message


def test_bad_provider_kind_lists_the_valid_kinds(write_config: Write) -> None:
    data = {"providers": {"a": {"kind": "cohere", "model": "m", "base_url": "https://x"}}, "panel": ["a"]}
    message = error_of(str(write_config(data)))
    assert message.startswith("config: providers.a.kind:")
    assert "openai" in message


def test_provider_missing_a_required_field_says_add_it(write_config: Write) -> None:
    data = {"providers": {"a": {"kind": "openai", "base_url": "https://x"}}, "panel": ["a"]}
    message = error_of(str(write_config(data)))
    assert "providers.a" in message
    assert "'model'" in message


def test_panel_naming_an_undefined_provider_lists_the_defined_ones(write_config: Write) -> None:
    message = error_of(str(write_config({**MINIMAL, "panel": ["a", "ghost"]})))
    assert message.startswith("config: panel[1]: provider 'ghost' is not defined")
    assert "one of: a" in message


def test_role_naming_an_undefined_provider_is_rejected(write_config: Write) -> None:
    message = error_of(str(write_config({**MINIMAL, "roles": {"critics": ["ghost"]}})))
    assert "roles.critics[0]" in message


def test_discovery_prefers_flag_then_environment_then_local_file(
    write_config: Write, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = write_config({**MINIMAL, "limits": {"max_tokens": 1}}, "flag.yaml")
    env_file = write_config({**MINIMAL, "limits": {"max_tokens": 2}}, "env.yaml")
    write_config({**MINIMAL, "limits": {"max_tokens": 3}}, "config.yaml")
    monkeypatch.chdir(tmp_path)
    env = {"CONCLAVE_CONFIG": str(env_file)}
    assert load_config(str(flag), env=env, dotenv=None).limits.max_tokens == 1
    assert load_config(None, env=env, dotenv=None).limits.max_tokens == 2
    assert load_config(None, env={}, dotenv=None).limits.max_tokens == 3


def test_without_any_file_the_packaged_default_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={}, dotenv=None)
    assert config.source == str(data_path("config.yaml"))


def test_cli_overrides_beat_environment_which_beats_the_file(write_config: Write) -> None:
    path = write_config({**MINIMAL, "providers": {**MINIMAL["providers"], "b": MINIMAL["providers"]["a"]}})
    config = load_config(str(path), env={"CONCLAVE_PANEL": "b"}, dotenv=None)
    assert config.panel == ("b",)
    config = load_config(str(path), env={"CONCLAVE_PANEL": "b"}, dotenv=None, overrides=["panel=[a]"])
    assert config.panel == ("a",)


def test_set_override_is_validated_like_the_file(write_config: Write) -> None:
    message = error_of(str(write_config(MINIMAL)), overrides=["limits.max_tokens=lots"])
    assert message.startswith("config: limits.max_tokens:")


def test_evals_dir_defaults_under_conclave_and_is_set_like_any_key(
    write_config: Write, tmp_path: Path
) -> None:
    assert load_config(str(data_path("config.yaml")), env={}, dotenv=None).evals.dir == ".conclave/evals"
    path = str(write_config({**MINIMAL, "evals": {"dir": "runs"}}))
    assert load_config(path, env={}, dotenv=None).evals.dir == "runs"
    set_dir = load_config(path, env={}, dotenv=None, overrides=[f"evals.dir={tmp_path}/e"])
    assert set_dir.evals.dir == f"{tmp_path}/e"
    assert error_of(path, overrides=["evals.folder=x"]).startswith("config: evals: ")
    assert error_of(path, overrides=["evals.dir="]).startswith("config: evals.dir: ")
    (tmp_path / "blocker").write_text("a file where the evals folder should be")
    message = error_of(path, overrides=[f"evals.dir={tmp_path}/blocker"])
    assert message.startswith("config: evals.dir: ") and "is a file, not a folder" in message


def test_keys_come_from_the_environment_over_a_local_dotenv(write_config: Write, tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("# keys\nexport A_KEY='from-dotenv-123456'\n", encoding="utf-8")
    path = str(write_config(MINIMAL))
    assert load_config(path, env={}, dotenv=dotenv).api_key("a") == "from-dotenv-123456"
    assert (
        load_config(path, env={"A_KEY": "from-env-1234567"}, dotenv=dotenv).api_key("a") == "from-env-1234567"
    )


def test_the_config_object_is_frozen_and_never_shows_keys(write_config: Write) -> None:
    config = load_config(str(write_config(MINIMAL)), env={"A_KEY": "sk-secret-value-123456"}, dotenv=None)
    assert "sk-secret-value-123456" not in repr(config)
    with pytest.raises(AttributeError):
        config.panel = ()  # type: ignore[misc]


def test_roles_default_from_the_panel_and_the_proposer_never_synthesizes(write_config: Write) -> None:
    providers = dict.fromkeys(("x", "y", "z"), MINIMAL["providers"]["a"])
    config = load_config(
        str(write_config({"providers": providers, "panel": ["x", "y", "z"]})), env={}, dotenv=None
    )
    assert config.roles.proposer == "x"
    assert config.roles.critics == ("y", "z")
    assert config.roles.synthesizer == "y"
    assert config.roles.synthesizer_fallbacks == ("x", "z")


def test_roles_left_out_are_derived_around_the_ones_given(write_config: Write) -> None:
    providers = dict.fromkeys(("x", "y", "z"), MINIMAL["providers"]["a"])
    data = {"providers": providers, "panel": ["x", "y", "z"], "roles": {"proposer": "z"}}
    roles = load_config(str(write_config(data)), env={}, dotenv=None).roles
    assert (roles.proposer, roles.critics, roles.synthesizer) == ("z", ("x", "y"), "x")


def test_the_packaged_roles_are_the_ones_derived_from_its_panel() -> None:
    roles = load_config(str(data_path("config.yaml")), env={}, dotenv=None).roles
    assert roles.proposer == "openai"
    assert roles.critics == ("anthropic", "gemini")
    assert roles.synthesizer == "anthropic"
    assert roles.synthesizer_fallbacks == ("openai", "gemini")


# ---------------------------------------------------------------- a user's file over the defaults


def test_a_file_that_sets_only_the_panel_keeps_every_preset(write_config: Write) -> None:
    config = load_config(str(write_config({"panel": ["openai", "mistral"]})), env={}, dotenv=None)
    assert config.panel == ("openai", "mistral")
    assert "ollama" in config.providers and config.providers["mistral"].kind == "openai"
    assert (config.roles.proposer, config.roles.critics, config.roles.synthesizer) == (
        "openai",
        ("mistral",),
        "mistral",
    )
    assert config.limits.timeout_seconds == 50


def test_one_field_of_a_preset_overrides_only_that_field(write_config: Write) -> None:
    data = {"providers": {"openai": {"model": "gpt-4.1"}}, "limits": {"retry": {"max_attempts": 5}}}
    config = load_config(str(write_config(data)), env={}, dotenv=None)
    openai = config.providers["openai"]
    assert openai.model == "gpt-4.1"
    assert openai.base_url == "https://api.openai.com/v1" and openai.api_key_env == "OPENAI_API_KEY"
    assert config.limits.retry.max_attempts == 5
    assert config.limits.retry.max_delay_seconds == 8.0 and config.limits.max_tokens == 1024


def test_a_users_price_replaces_the_presets_whole(write_config: Write) -> None:
    data = {"providers": {"openai": {"price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}}
    price = load_config(str(write_config(data)), env={}, dotenv=None).providers["openai"].price
    assert price is not None
    assert (price.input_per_mtok, price.cached_input_per_mtok) == (1.0, None)


def test_a_new_provider_still_needs_its_required_fields(write_config: Write) -> None:
    message = error_of(str(write_config({"providers": {"mine": {"kind": "openai", "model": "m"}}})))
    assert message.startswith("config: providers.mine:") and "base_url" in message


@pytest.mark.parametrize(
    ("data", "env"),
    [({"panel": []}, {}), ({}, {"CONCLAVE_PANEL": " , "})],
    ids=["empty-panel", "blank-CONCLAVE_PANEL"],
)
def test_a_config_with_nobody_to_ask_is_refused_with_the_fix(
    write_config: Write, data: dict[str, Any], env: dict[str, str]
) -> None:
    message = error_of(str(write_config(data or {"limits": {"max_tokens": 9}})), env=env)
    assert "panel" in message.lower()
    assert "openai" in message  # the fix names a provider to write


# ---------------------------------------------------------------- errors name their origin


def test_an_error_from_set_is_blamed_on_the_set_not_the_file(write_config: Write) -> None:
    path = str(write_config(MINIMAL))
    message = error_of(path, overrides=["limts.timeout_seconds=5"])
    assert "from --set limts.timeout_seconds=5" in message
    assert path not in message
    message = error_of(path, overrides=["limits.timeout_seconds=soon"])
    assert message.startswith("config: limits.timeout_seconds:")
    assert "from --set limits.timeout_seconds=soon" in message


def test_a_list_written_without_brackets_in_set_says_values_are_yaml(write_config: Write) -> None:
    message = error_of(str(write_config(MINIMAL)), overrides=["panel=openai,xai"])
    assert "read as YAML" in message and "[openai,xai]" in message
    assert "from --set panel=openai,xai" in message


def test_an_error_in_the_file_still_names_the_file(write_config: Write) -> None:
    path = str(write_config({**MINIMAL, "limits": {"timeout": 5}}))
    assert error_of(path, overrides=["limits.max_tokens=9"]).endswith(f"(in {path})")


def test_a_users_own_providers_come_before_the_presets(write_config: Write) -> None:
    config = load_config(str(write_config(MINIMAL)), env={}, dotenv=None)
    assert list(config.providers)[:2] == ["a", "openai"]
    assert config.providers["a"].api_key_env == "A_KEY" and len(config.providers) == 11
