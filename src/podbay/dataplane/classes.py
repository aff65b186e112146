"""The sandbox classes one server runs: class → driver, and what ``default`` means.

Built with the drivers of the enabled classes (``runtime.classes``); at
start-up :meth:`ClassRuntimes.start` checks each host and prepares each
driver (``podbay serve`` passes :func:`podbay.runtime.classes.check_class`),
then proves classes by running a machine of each
(:func:`podbay.runtime.classes.prove_class`): the one ``default`` means
before the server is ready, the others in the background (a ``vm`` guest
under TCG takes seconds to boot; attaching one meanwhile is a 503). A class
whose driver could not be built, prepared, checked or proven is
*unavailable*, with the reason; the others run. :meth:`ClassRuntimes.resolve`
turns attach's ``class`` into the class a new sandbox gets, or refuses with
the contract's code and a message naming what this server can run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from podbay.errors import ApiError
from podbay.runtime.base import Driver
from podbay.runtime.classes import (
    CLASSES,
    HostCheck,
    enabled_classes,
    is_class_name,
    resolve_default,
)
from podbay.settings import Settings
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS

log = logging.getLogger("podbay.classes")
#: ``Retry-After`` of an attach of a class still being checked (a first
#: machine of it starting: seconds, tens of seconds for a ``vm`` under TCG).
CHECKING_RETRY_SECONDS = 2

#: ``check(class name, driver)``: the host check, then the driver prepared: whether
#: the class can run here, and how fast. Bounded in time.
ClassCheck = Callable[[str, Driver], Awaitable[HostCheck]]
#: ``prove(class name, prepared driver)``: a machine of the class runs (it may
#: take a while, e.g. a guest under TCG); returns a detail, raises when not.
ClassProof = Callable[[str, Driver], Awaitable[str]]


@dataclass(frozen=True)
class ClassStatus:
    name: str
    enabled: bool
    available: bool
    fast: bool
    detail: str


def refuse_unknown_class(requested: str) -> None:
    """400 ``SANDBOX_CLASS_UNKNOWN`` unless ``requested`` names a class or ``default``."""
    if not is_class_name(requested):
        raise ApiError(
            ErrorCode.SANDBOX_CLASS_UNKNOWN,
            f"unknown sandbox class {requested!r}; classes are "
            f"{', '.join([DEFAULT_SANDBOX_CLASS, *CLASSES])}",
        )


class ClassRuntimes:
    @classmethod
    def from_settings(
        cls, settings: Settings, drivers: Mapping[str, Driver], missing: Mapping[str, str] | None
    ) -> ClassRuntimes:
        """The classes ``settings`` enable, on ``drivers``, with the pinned default."""
        return cls(
            enabled_classes(settings),
            drivers,
            pin=settings.runtime.default_class.strip(),
            missing=missing,
        )

    def __init__(
        self,
        enabled: Sequence[str],
        drivers: Mapping[str, Driver],
        *,
        pin: str = "",
        missing: Mapping[str, str] | None = None,
    ) -> None:
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
        #: Classes whose host check passed, still being proven in the background.
        self._pending: set[str] = set()
        self._later: asyncio.Task[None] | None = None
        #: Proved after start-up, its machines not yet taken up (routes, resumes):
        #: /healthz does not call it available until they are.
        self._taking_up: set[str] = set()

    # -- start-up ------------------------------------------------------------------------
    async def start(
        self,
        check: ClassCheck | None = None,
        prove: ClassProof | None = None,
        later: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Check every class's host and prepare its driver (all at once), then prove
        classes by running a machine in each: first what ``default`` means (in
        order of preference, falling back while proofs fail), so the server can
        serve; the others in the background, each ``later(name)`` once it
        proved able to run. A failure makes that class unavailable, not the
        server. Raises when no enabled class can run."""
        names = list(self.drivers)
        hosts = dict(
            zip(
                names,
                await asyncio.gather(*(self._host(name, check) for name in names)),
                strict=True,
            )
        )
        candidates = dict(hosts)
        while True:
            choice = resolve_default(self.enabled, {**self._checks, **candidates}, self.pin)
            if choice is None or choice not in candidates or not candidates[choice].works:
                break
            await self._prove(choice, prove, candidates.pop(choice))
            if self.works(choice) or choice == self.pin:
                break
        self.default = choice
        rest = [n for n in names if n not in self._checks]
        for name in rest:
            if not hosts[name].works:
                self._checks[name] = hosts[name]
        self._pending = {n for n in rest if hosts[n].works}
        if not self.available and not self._pending:
            raise RuntimeError(
                "no sandbox class can run here: "
                + "; ".join(f"{s.name}: {s.detail}" for s in self.statuses() if s.enabled)
            )
        log.info("sandbox class default means %s", self.default)
        if self._pending:
            self._later = asyncio.get_running_loop().create_task(
                self._prove_rest([n for n in rest if n in self._pending], prove, hosts, later)
            )

    async def proven(self) -> None:
        """Wait until the classes proved in the background are (each proved and
        its machines taken up, or found unable to run)."""
        if self._later is not None:
            await asyncio.gather(asyncio.shield(self._later), return_exceptions=True)

    async def _host(self, name: str, check: ClassCheck | None) -> HostCheck:
        driver = self.drivers[name]
        try:
            if check is not None:
                return await check(name, driver)
            await driver.prepare()
            return HostCheck(True, True, "prepared")
        except Exception as exc:
            log.exception("sandbox class %s cannot run here", name)
            return HostCheck(False, False, f"{type(exc).__name__}: {exc}")

    async def _prove(self, name: str, prove: ClassProof | None, host: HostCheck) -> None:
        result = host
        if prove is not None:
            try:
                result = host._replace(
                    detail=f"{host.detail}; {await prove(name, self.drivers[name])}"
                )
            except Exception as exc:
                log.exception("sandbox class %s: no machine of it runs", name)
                result = HostCheck(
                    False, False, f"a machine did not run: {type(exc).__name__}: {exc}"
                )
        self._checks[name] = result
        log.info(
            "sandbox class %s: %s (%s)",
            name,
            "runs" if result.works else "unavailable",
            result.detail,
        )

    async def _prove_rest(
        self,
        names: Sequence[str],
        prove: ClassProof | None,
        hosts: Mapping[str, HostCheck],
        later: Callable[[str], Awaitable[None]] | None,
    ) -> None:
        for name in names:
            try:
                await self._prove(name, prove, hosts[name])
            finally:
                self._pending.discard(name)
            if self.works(name) and later is not None:
                self._taking_up.add(name)
                try:
                    await later(name)
                except Exception:
                    log.exception("sandbox class %s: taking up its machines failed", name)
                finally:
                    self._taking_up.discard(name)

    async def close(self) -> None:
        """Stop proving classes in the background."""
        if self._later is not None:
            self._later.cancel()
            await asyncio.gather(self._later, return_exceptions=True)

    # -- questions -----------------------------------------------------------------------
    @property
    def available(self) -> tuple[str, ...]:
        """Enabled classes that run here, in order of preference."""
        return tuple(n for n in self.enabled if n in self.drivers and self.works(n))

    @property
    def checking(self) -> tuple[str, ...]:
        """Enabled classes still being proved: attach answers 503 with
        ``Retry-After`` for them (``/healthz`` lists them as ``checking``)."""
        return tuple(n for n in self.enabled if n in self._pending)

    def works(self, name: str) -> bool:
        check = self._checks.get(name)
        return check is not None and check.works

    def statuses(self) -> list[ClassStatus]:
        """Every known class, enabled or not, as this server sees it."""
        out = []
        for name in CLASSES:
            check = self._checks.get(name)
            if name not in self.enabled:
                out.append(ClassStatus(name, False, False, False, "not enabled (runtime.classes)"))
            elif check is None:
                out.append(ClassStatus(name, True, False, False, "being checked"))
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
        refuse_unknown_class(requested)
        name = self.default if requested == DEFAULT_SANDBOX_CLASS else requested
        if name is None:
            raise self._unavailable("'default'", "no class runs here")
        return self.require(name, asked=requested)

    def require(self, name: str, *, asked: str | None = None) -> str:
        """``name`` when this server runs it now; else 409 naming what it runs."""
        if name in self.checking:
            # Temporary, and said so (Retry-After): clients wait it out instead
            # of giving up on a class that runs here a few seconds later.
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                f"sandbox class {name!r} is still being checked on this server "
                "(its first machine is starting); try again shortly",
                retry_after=CHECKING_RETRY_SECONDS,
            )
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
        return ApiError(
            ErrorCode.SANDBOX_CLASS_UNAVAILABLE,
            f"sandbox class {what} is not available on this server: {why}; it can run: {runs}",
        )

    def describe(self) -> dict[str, object]:
        """For ``/healthz``: what runs and what ``default`` means."""
        return {
            "default": self.default,
            "available": [n for n in self.available if n not in self._taking_up],
            "enabled": list(self.enabled),
            "checking": list(self.checking),
        }
