"""The "podbay" sandbox type as inspect finds and stores it, without a server: the
entry point registers it, its config survives the eval log's round trip (as
``inspect eval-retry`` reads it back), sandbox names follow the contract."""

from __future__ import annotations

import pytest
from inspect_ai.util import SandboxEnvironmentSpec
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from podbay.integrations.inspect_ai import (
    NAME_PREFIX,
    PodbaySandboxEnvironment,
    PodbaySandboxEnvironmentConfig,
    _config,
    sandbox_name,
)
from podbay.wire.limits import is_valid_sandbox_name


def test_inspect_finds_the_type_by_name() -> None:
    assert registry_find_sandboxenv("podbay") is PodbaySandboxEnvironment


def test_config_round_trips_through_the_eval_log() -> None:
    config = PodbaySandboxEnvironmentConfig(
        sandbox_class="gvisor", environment={"A": "1"}, user="user", working_dir="/home/user"
    )
    spec = SandboxEnvironmentSpec("podbay", config)
    again = SandboxEnvironmentSpec.model_validate_json(spec.model_dump_json())
    assert again.config == config
    assert isinstance(again.config, PodbaySandboxEnvironmentConfig)


def test_a_config_file_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ValueError, match="PodbaySandboxEnvironmentConfig"):
        _config("compose.yaml")
    assert _config(None) == PodbaySandboxEnvironmentConfig()


@pytest.mark.parametrize("task", ["my task/v2", "", "---", "ü" * 90, "a" * 300])
def test_sandbox_names_follow_the_contract(task: str) -> None:
    names = {sandbox_name(task) for _ in range(3)}
    assert len(names) == 3  # one per sample
    for name in names:
        assert name.startswith(NAME_PREFIX), name
        assert is_valid_sandbox_name(name), name
