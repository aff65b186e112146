"""Driver names → factories taking :class:`~podbay.settings.Settings`.

The control plane asks for ``settings.runtime.driver``; nothing is imported
until a driver is built, so a host without runc can still run other pieces.

>>> sorted(DRIVERS)
['oci']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..settings import Settings
from .base import Driver

#: name → "module:attribute" of a class or function taking ``Settings``.
DRIVERS: dict[str, str] = {
    "oci": "podbay.runtime.oci.driver:OciDriver",
}


def register(name: str, target: str) -> None:
    """Make another driver selectable by name (third parties use this too)."""
    DRIVERS[name] = target


def factory(name: str) -> Callable[[Settings], Driver]:
    try:
        module, _, attribute = DRIVERS[name].partition(":")
    except KeyError:
        raise ValueError(
            f"unknown runtime driver {name!r} (known: {', '.join(sorted(DRIVERS))})"
        ) from None
    built: Callable[[Settings], Driver] = getattr(importlib.import_module(module), attribute)
    return built


def build(settings: Settings) -> Driver:
    """The driver ``settings.runtime.driver`` names, configured by ``settings``."""
    return factory(settings.runtime.driver)(settings)
