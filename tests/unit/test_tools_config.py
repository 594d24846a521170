"""`models[].tools`: read, mapped onto vLLM's options, and checked against each request."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.backends import llm_config_for
from core.config import ClusterConfig, ConfigError, ToolsConfig, load_config
from core.errors import ApiError
from policy.request import check_tool_support

BASE: dict[str, Any] = {
    "pools": [{"name": "local", "kind": "local"}],
    "models": [
        {
            "role": "orchestrator",
            "source": "./models/orc",
            "context_window": 4096,
            "pools": ["local"],
            "tools": {"parser": "hermes", "chat_template": "templates/tools.jinja"},
        },
        {"role": "coding", "source": "./models/code", "context_window": 4096, "pools": ["local"]},
    ],
    "fallback": {"source": "./fallback.gguf"},
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def load(tmp_path: Path, data: dict[str, Any]) -> ClusterConfig:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "tools.jinja").write_text("{{ messages }}")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, environ={})


def test_tools_become_vllms_own_options(tmp_path: Path) -> None:
    config = load(tmp_path, copy.deepcopy(BASE))
    [orchestrator, coding] = config.home_backends
    kwargs = llm_config_for(config, orchestrator).engine_kwargs
    assert kwargs["tool_call_parser"] == "hermes"
    assert kwargs["enable_auto_tool_choice"] is True
    assert kwargs["tool_strict_level"] == "auto"  # `strict: true` makes it "parameter"
    assert kwargs["chat_template"] == str(tmp_path / "templates" / "tools.jinja")
    assert "tool_call_parser" not in llm_config_for(config, coding).engine_kwargs


def test_tool_options_in_engine_kwargs_point_to_models_tools(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["models"][1]["engine_kwargs"] = {"enable_auto_tool_choice": True}
    with pytest.raises(
        ConfigError,
        match=r"models\[1\].engine_kwargs.enable_auto_tool_choice: set models\[1\].tools",
    ):
        load(tmp_path, data)


def test_a_missing_template_is_named(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["models"][0]["tools"]["chat_template"] = "templates/absent.jinja"
    with pytest.raises(
        ConfigError, match=r"models\[0\].tools.chat_template: .*absent.jinja is not a file"
    ):
        load(tmp_path, data)


def test_a_parser_name_is_checked(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["models"][0]["tools"] = {"parser": "--enable-everything"}
    with pytest.raises(ConfigError, match=r"models.0.tools.parser"):
        load(tmp_path, data)


def test_a_model_without_tools_refuses_them_naming_the_config_key() -> None:
    with pytest.raises(ApiError) as refused:
        check_tool_support({"tools": [TOOL]}, "coding", None)
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "tools_not_supported", "tools")
    assert "'coding' is not configured for tool calling" in error.message
    assert "models[]" in error.message
    assert "--" not in error.message


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"tools": []},
        {"tools": [TOOL], "tool_choice": "none"},
    ],
)
def test_requests_that_call_no_tool_pass_any_model(payload: dict[str, Any]) -> None:
    check_tool_support(payload, "coding", None)


def test_auto_choice_off_asks_for_an_explicit_choice() -> None:
    manual = ToolsConfig(parser="hermes", auto_choice=False)
    with pytest.raises(ApiError, match="auto_choice"):
        check_tool_support({"tools": [TOOL]}, "orchestrator", manual)
    named = {"type": "function", "function": {"name": "get_weather"}}
    check_tool_support({"tools": [TOOL], "tool_choice": named}, "orchestrator", manual)
    check_tool_support({"tools": [TOOL], "tool_choice": "required"}, "orchestrator", manual)
    check_tool_support({"tools": [TOOL]}, "orchestrator", ToolsConfig(parser="hermes"))


def test_targets_say_which_links_take_tools_and_what_template_they_render_with(
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(BASE)
    data["fallback"]["tools"] = {"parser": "hermes", "chat_template": "templates/tools.jinja"}
    config = load(tmp_path, data)
    orchestrator = config.targets["orchestrator@local"]
    coding = config.targets["coding@local"]
    fallback = config.targets["cpu-fallback"]
    template = str(tmp_path / "templates" / "tools.jinja")
    assert (orchestrator.tools, orchestrator.chat_template) == (True, template)
    assert (coding.tools, coding.chat_template) == (False, None)
    assert (fallback.tools, fallback.chat_template) == (True, template)
    # One counter per tokenizer and template: the same model under another template is another.
    assert coding.counter_key == coding.tokenizer
    assert orchestrator.counter_key != orchestrator.tokenizer


def test_the_llama_cpp_fallback_reads_hermes_calls_only(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["fallback"]["tools"] = {"parser": "llama3_json"}
    with pytest.raises(ConfigError, match="fallback reads tool calls in the Hermes format only"):
        load(tmp_path, data)
    data["fallback"]["tools"] = {"parser": "hermes", "chat_template": "nowhere.jinja"}
    with pytest.raises(ConfigError, match=r"fallback.tools.chat_template: .*nowhere.jinja"):
        load(tmp_path, data)


def test_a_jinja_template_on_the_fallback_is_for_llama_cpp_only(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["fallback"] = {
        "engine": "ollama",
        "source": "qwen2.5:3b",
        "tools": {"parser": "hermes", "chat_template": "templates/tools.jinja"},
    }
    with pytest.raises(ConfigError, match=r"a Jinja template is for llama\.cpp"):
        load(tmp_path, data)
    data["fallback"]["tools"] = {"parser": "hermes"}  # Ollama's own template reads the calls
    assert load(tmp_path, data).targets["cpu-fallback"].tools


def test_every_vllm_backend_runs_the_priority_scheduler_unless_its_model_says_otherwise(
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(BASE)
    data["models"][1]["engine_kwargs"] = {"scheduling_policy": "fcfs"}
    config = load(tmp_path, data)
    [orchestrator, coding] = config.home_backends
    assert llm_config_for(config, orchestrator).engine_kwargs["scheduling_policy"] == "priority"
    assert llm_config_for(config, coding).engine_kwargs["scheduling_policy"] == "fcfs"
    data["router"] = {"engine_priority": False}
    config = load(tmp_path, data)
    assert "scheduling_policy" not in llm_config_for(config, config.home_backends[0]).engine_kwargs


def test_a_generating_backend_that_may_run_two_replicas_routes_by_prefix_and_session(
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(BASE)
    data["models"][0]["replicas"] = 2
    config = load(tmp_path, data)
    [orchestrator, coding] = config.home_backends
    options = llm_config_for(config, orchestrator).deployment_config
    router = options["request_router_config"]
    assert (
        router["request_router_class"]
        == "deployments.router.adapters.replica_choice.SessionPrefixRouter"
    )
    assert router["request_router_kwargs"] == {
        "imbalanced_threshold": 2, "session_slack": 2, "do_eviction": True,
    }  # fmt: skip
    # One replica: nothing to choose, Serve's own router.
    assert "request_router_config" not in llm_config_for(config, coding).deployment_config
    data["router"] = {"prefix_routing": False}
    config = load(tmp_path, data)
    off = llm_config_for(config, config.home_backends[0]).deployment_config
    assert "request_router_config" not in off
