"""Settings: defaults, PODBAY_* variables, then flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.settings import Settings


def test_defaults_match_the_product() -> None:
    s = Settings.load(environ={})
    assert (
        s.lifecycle.idle_seconds,
        s.lifecycle.suspended_ttl_seconds,
        s.lifecycle.max_age_seconds,
    ) == (900, 3600, 8 * 3600)
    assert s.caps.per_deployment == 20
    assert s.credentials.ttl_seconds == 900
    assert s.server.base_url() == "http://127.0.0.1:8700"


def test_environment_then_overrides() -> None:
    s = Settings.load(
        environ={
            "PODBAY_LIFECYCLE_IDLE_SECONDS": "2.5",
            "PODBAY_RUNTIME_NETWORK": "no",
            "PODBAY_DATA_DIR": "/tmp/pb",
        },
        server__public_url="https://sb.example/",
        caps__per_deployment=None,
    )
    assert s.lifecycle.idle_seconds == 2.5
    assert s.runtime.network is False
    assert s.data_dir == Path("/tmp/pb")
    assert s.server.base_url() == "https://sb.example"
    assert s.caps.per_deployment == 20


@pytest.mark.parametrize(
    ("name", "value"), [("PODBAY_RUNTIME_PIDS", "many"), ("PODBAY_RUNTIME_NETWORK", "maybe")]
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.load(environ={name: value})


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown setting"):
        Settings.load(environ={}, runtime__colour="blue")


def test_layers_live_in_the_data_directory_unless_set_elsewhere() -> None:
    assert Settings.load(environ={"PODBAY_DATA_DIR": "/tmp/pb"}).layer_dir == Path("/tmp/pb/layers")
    shared = Settings.load(
        environ={"PODBAY_DATA_DIR": "/tmp/pb", "PODBAY_RUNTIME_LAYER_DIR": "/var/tmp/layers"}
    )
    assert shared.layer_dir == Path("/var/tmp/layers")
