"""Names a package exports but imports only on first use.

Here, in the stdlib-only package that is staged into every sandbox, so that
``podbay``, ``podbay.client`` and ``podbay.wire`` share one implementation.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to
    the module that defines it (absolute, or relative to ``package``); the
    value is imported on first use and kept in the package's namespace."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib  # here: it loads warnings, and most starts never call this

        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
