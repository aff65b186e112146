"""The sandbox classes one server runs: class → driver, and what ``default`` means.

Built with the drivers of the enabled classes (``runtime.classes``); at
start-up :meth:`ClassRuntimes.start` prepares each and, given a ``check``
(``podbay serve`` passes :func:`podbay.runtime.classes.check_class`), proves it
can run here. A class whose driver could not be built, prepared or checked is
*unavailable*, with the reason; the others run. :meth:`ClassRuntimes.resolve`
turns attach's ``class`` into the class a new sandbox gets, or refuses with
the contract's code and a message naming what this server can run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from podbay.errors import ApiError
from podbay.runtime.base import Driver
from podbay.runtime.classes import CLASSES, HostCheck, is_class_name, resolve_default
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS

log = logging.getLogger("podbay.classes")

#: ``check(class name, driver)``: prepares the driver and says whether the class
#: runs here, and how fast.
ClassCheck = Callable[[str, Driver], Awaitable[HostCheck]]


@dataclass(frozen=True)
class ClassStatus:
    name: str
    enabled: bool
    available: bool
    fast: bool
    detail: str


class ClassRuntimes:
    def __init__(self, enabled: Sequence[str], drivers: Mapping[str, Driver], *,
                 pin: str = "", missing: Mapping[str, str] | None = None) -> None:
        self.enabled = tuple(enabled)
        self.drivers = {name: drivers[name] for name in self.enabled if name in drivers}
        self.pin = pin
        self._checks: dict[str, HostCheck] = {}
        for name in self.enabled:
            if name not in self.drivers:
                reason = (missing or {}).get(name, "no driver was built for it")
                self._checks[name] = HostCheck(False, False, reason)
        #: What ``default`` means; ``None`` until :meth:`start` (or when nothing runs).
        self.default: str | None = None

    # -- start-up ------------------------------------------------------------------------
    async def start(self, check: ClassCheck | None = None) -> None:
        """Prepare every class's driver (and check it); a failure makes that class
        unavailable, not the server. Raises when no enabled class can run."""
        for name, driver in self.drivers.items():
            try:
                if check is not None:
                    result = await check(name, driver)
                else:
                    await driver.prepare()
                    result = HostCheck(True, True, "prepared")
            except Exception as exc:
                log.exception("sandbox class %s cannot run here", name)
                result = HostCheck(False, False, f"{type(exc).__name__}: {exc}")
            self._checks[name] = result
            log.info("sandbox class %s: %s (%s)", name,
                     "runs" if result.works else "unavailable", result.detail)
        self.default = resolve_default(self.enabled, self._checks, self.pin)
        if not self.available:
            raise RuntimeError("no sandbox class can run here: " + "; ".join(
                f"{s.name}: {s.detail}" for s in self.statuses()))
        log.info("sandbox class default means %s", self.default)

    # -- questions -----------------------------------------------------------------------
    @property
    def available(self) -> tuple[str, ...]:
        """Enabled classes that run here, in order of preference."""
        return tuple(n for n in self.enabled if n in self.drivers and self.works(n))

    def works(self, name: str) -> bool:
        check = self._checks.get(name)
        return check is not None and check.works

    def statuses(self) -> list[ClassStatus]:
        """Every known class, enabled or not, as this server sees it."""
        out = []
        for name in CLASSES:
            check = self._checks.get(name)
            if name not in self.enabled:
                out.append(ClassStatus(name, False, False, False,
                                       "not enabled (runtime.classes)"))
            elif check is None:
                out.append(ClassStatus(name, True, False, False, "not checked yet"))
            else:
                out.append(ClassStatus(name, True, check.works, check.fast, check.detail))
        return out

    def driver(self, name: str) -> Driver:
        """The driver of an available class (:meth:`resolve` or :meth:`require` first)."""
        return self.drivers[name]

    def running(self) -> dict[str, Driver]:
        """The drivers of the available classes."""
        return {name: self.drivers[name] for name in self.available}

    # -- attach's class ---------------------------------------------------------------------
    def resolve(self, requested: str) -> str:
        """The class a new sandbox asked for as ``requested`` gets."""
        if not is_class_name(requested):
            raise ApiError(ErrorCode.SANDBOX_CLASS_UNKNOWN,
                           f"unknown sandbox class {requested!r}; classes are "
                           f"{', '.join([DEFAULT_SANDBOX_CLASS, *CLASSES])}")
        name = self.default if requested == DEFAULT_SANDBOX_CLASS else requested
        if name is None:
            raise self._unavailable("'default'", "no class runs here")
        return self.require(name, asked=requested)

    def require(self, name: str, *, asked: str | None = None) -> str:
        """``name`` when this server runs it now; else 409 naming what it runs."""
        if name in self.available:
            return name
        what = repr(name) if asked in (None, name) else f"'default' (pinned to {name!r})"
        if name not in self.enabled:
            return self._raise(what, "it is not enabled here (runtime.classes)")
        check = self._checks.get(name)
        return self._raise(what, check.detail if check else "it is not ready")

    def _raise(self, what: str, why: str) -> str:
        raise self._unavailable(what, why)

    def _unavailable(self, what: str, why: str) -> ApiError:
        runs = ", ".join(self.available) or "none"
        return ApiError(ErrorCode.SANDBOX_CLASS_UNAVAILABLE,
                        f"sandbox class {what} is not available on this server: {why}; "
                        f"it can run: {runs}")

    def describe(self) -> dict[str, object]:
        """For ``/healthz``: what runs and what ``default`` means."""
        return {"default": self.default, "available": list(self.available),
                "enabled": list(self.enabled)}
