"""Every exception podbay defines is in the one tree of ``podbay/errors.py``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import podbay
import podbay.errors

#: Components may define a subclass next to the code that raises it, as long
#: as it derives from the tree (and the tree's drawing names it).
DEFINED_ELSEWHERE: set[str] = set()
#: Sources podbay sends into a sandbox to run there, beside no podbay package:
#: what they raise is the sandbox's, shown to its caller by name.
RUN_IN_SANDBOXES = {"podbay.e2b._bash_cell"}


def _podbay_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(podbay.__path__, "podbay."):
        if info.name.endswith("__main__") and info.name != "podbay.agent.__main__":
            continue
        if info.name in RUN_IN_SANDBOXES:
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("podbay."):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_derives_from_podbay_error() -> None:
    found = _podbay_exceptions()
    assert "podbay.errors.DriverError" in found  # the walk reached the runtime
    outside_the_tree = [
        name for name, cls in found.items() if not issubclass(cls, podbay.errors.PodbayError)
    ]
    assert outside_the_tree == []


def test_exceptions_live_in_errors_py() -> None:
    elsewhere = {name for name in _podbay_exceptions() if not name.startswith("podbay.errors.")}
    assert elsewhere <= DEFINED_ELSEWHERE


def test_the_docstring_draws_every_class() -> None:
    drawn = {"PodbayError", *re.findall(r"── (\w+)", podbay.errors.__doc__ or "")}
    defined = {name.rsplit(".", 1)[1] for name in _podbay_exceptions()}
    assert drawn == defined
