"""Driver names to factories: nothing imported until a driver is built."""

from __future__ import annotations

import pytest

from podbay.runtime import registry
from podbay.settings import Settings


def test_the_oci_driver_is_built_from_settings() -> None:
    assert "oci" in registry.DRIVERS
    driver = registry.build(Settings.load(environ={}))
    assert driver.name == "oci"


def test_an_unknown_name_says_which_are_known() -> None:
    with pytest.raises(ValueError, match=r"unknown runtime driver 'nope' \(known: .*oci"):
        registry.factory("nope")


def test_a_registered_driver_is_built_when_settings_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from podbay.runtime.oci.driver import OciDriver

    monkeypatch.setattr(registry, "DRIVERS", dict(registry.DRIVERS))
    registry.register("oci-again", "podbay.runtime.oci.driver:OciDriver")
    settings = Settings.load(environ={})
    settings.runtime.driver = "oci-again"
    assert isinstance(registry.build(settings), OciDriver)
