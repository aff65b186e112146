"""What E2B's two APIs share: API keys, access tokens, the E2B row of a
sandbox, and reaching the sandbox's data plane (attach, then its gateway).

An E2B sandbox IS a podbay sandbox of the key's deployment, named by its E2B
id, so podbay's own API lists and uses it too; the ``e2b_sandboxes`` row holds
what E2B's API says that podbay's record has no field for (template,
metadata, env vars, the timeout's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import secrets
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

import httpx

from podbay.asgi import ASGIApp
from podbay.control.services.options import check_env, check_labels
from podbay.control.services.sandboxes import Attached, SandboxService
from podbay.dataplane.environment_seam import Building
from podbay.domain import Deployment, Sandbox, SandboxOptions, SandboxState
from podbay.domain.egress import EgressPolicy
from podbay.domain.options import NO_OPTIONS
from podbay.errors import ApiError
from podbay.store.e2b import E2BSandbox, E2BStore
from podbay.wire.codes import ErrorCode

from . import templates
from .error_responses import E2BError
from .inprocess import InProcessTransport
from .keys import KEY_PATTERN, SECRET_META_KEY, key_hash, new_api_key, new_secret, token_matches

if TYPE_CHECKING:
    from podbay.store.base import Store

log = logging.getLogger("podbay.e2b")
#: E2B ids are lowercase letters and digits; 20 of them carry ~103 random bits.
_ID_ALPHABET = string.ascii_lowercase + string.digits
#: How often expired sandboxes (past their E2B timeout) are looked for.
SWEEP_SECONDS = 1.0
#: E2B's default timeout, seconds; also a paused sandbox's once traffic resumes it.
DEFAULT_TIMEOUT = 300
#: E2B's ceiling on a sandbox's timeout (its Pro tier's 24 h).
MAX_TIMEOUT = 24 * 3600
ON_TIMEOUT = ("kill", "pause")
#: Longest a create waits for its environment's build before asking the SDK to
#: retry: its retrying transport then asks again while its request timeout
#: (60 s by default) lasts, so two holds and a retry fit in it.
BUILD_HOLD_SECONDS = 25.0
BUILD_RETRY_SECONDS = 1
#: A remembered attach is reused while its credential has this much left.
CREDENTIAL_MARGIN = timedelta(minutes=1)
MAX_REMEMBERED = 10_000


def new_sandbox_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


async def issue_key(store: Store, deployment: Deployment) -> str:
    """A new API key of ``deployment``; the store keeps its hash only."""
    key = new_api_key()
    await cast(E2BStore, store).add_e2b_key(key_hash(key), deployment.id, datetime.now(UTC))
    return key


async def revoke_keys(store: Store, deployment: Deployment) -> int:
    return await cast(E2BStore, store).revoke_e2b_keys(deployment.id, datetime.now(UTC))


class E2BService:
    def __init__(
        self,
        store: Store,
        sandboxes: SandboxService,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        local_gateway: tuple[str, ASGIApp] | None = None,
    ) -> None:
        self.store = store
        self.rows = cast(E2BStore, store)
        self.sandboxes = sandboxes
        self.clock = clock
        self._secret: str | None = None
        self._sweeper: asyncio.Task[None] | None = None
        #: The last attach of each sandbox, reused while its record says that
        #: incarnation still runs (see :meth:`reach`).
        self._attached: dict[str, Attached] = {}
        #: Called on close: the sandbox API's own state (its processes' timers).
        self.closers: list[Callable[[], None]] = []
        #: The data plane is reached over HTTP, as any client reaches it: in a
        #: cluster the endpoint is the sandbox's node, never this process.
        #: ``local_gateway`` (``podbay serve``: its base URL and its gateway): the
        #: calls to it are handed to it in process (``podbay.e2b.inprocess``).
        transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport()
        if local_gateway is not None:
            transport = InProcessTransport(*local_gateway, transport)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), transport=transport)

    # -- credentials -----------------------------------------------------------------
    async def deployment_for_key(self, key: str | None) -> Deployment:
        if not key:
            raise E2BError(401, "E2B_API_KEY_MISSING", "an API key is required (X-API-Key)")
        if not KEY_PATTERN.match(key):
            raise E2BError(401, "E2B_API_KEY_INVALID", "invalid API key: e2b_ + 40 hex expected")
        deployment_id = await self.rows.e2b_key_deployment(key_hash(key))
        deployment = (
            None if deployment_id is None else await self.store.get_deployment(deployment_id)
        )
        if deployment is None:
            raise E2BError(401, "E2B_API_KEY_INVALID", "invalid API key (unknown or revoked)")
        return deployment

    async def secret(self) -> str:
        if self._secret is None:
            found = await self.store.get_meta(SECRET_META_KEY)
            if found is None:
                # Two replicas racing here both write; the second read settles it.
                await self.store.set_meta(SECRET_META_KEY, new_secret())
                found = await self.store.get_meta(SECRET_META_KEY)
            assert found is not None
            self._secret = found
        return self._secret

    async def access_token(self, sandbox_id: str) -> str:
        from .keys import access_token

        return access_token(await self.secret(), sandbox_id)

    async def signer(
        self, sandbox_id: str | None, offered: str, signed: tuple[str, str, str, int | None]
    ) -> tuple[str, str] | None:
        """The sandbox whose token made the file URL signature ``offered`` of
        ``signed`` (path, operation, username, expiration), and that token:
        ``sandbox_id``'s, or with none named (a URL built on E2B_SANDBOX_URL),
        any E2B sandbox's, each tried in turn (their tokens differ)."""
        from .keys import access_token, file_signature

        secret = await self.secret()
        candidates = (
            [sandbox_id]
            if sandbox_id is not None
            else [row.sandbox_id for row in await self.rows.list_e2b_sandboxes()]
        )
        path, operation, username, expiration = signed
        for candidate in candidates:
            token = access_token(secret, candidate)
            expected = file_signature(path, operation, username, token, expiration)
            # bytes: the offered signature is the caller's, any text at all
            if hmac.compare_digest(expected.encode(), offered.encode()):
                return candidate, token
        return None

    async def authorize(
        self, sandbox_id: str, access: str | None, api_key: str | None
    ) -> tuple[Deployment, E2BSandbox]:
        """The sandbox a data-plane request may reach: its access token, or an
        API key of its deployment. Another deployment's sandbox is "not found"."""
        if access is not None:
            if not token_matches(await self.secret(), sandbox_id, access):
                raise E2BError(401, "E2B_ACCESS_TOKEN_INVALID", "invalid access token")
            found = await self.rows.get_e2b_sandbox_and_deployment(sandbox_id)
            if found is None:
                raise sandbox_not_found(sandbox_id)
            row, deployment = found
            return deployment, row
        if api_key is None:
            raise E2BError(
                401, "E2B_ACCESS_TOKEN_MISSING", "an access token is required (X-Access-Token)"
            )
        deployment = await self.deployment_for_key(api_key)
        return deployment, await self.row(deployment, sandbox_id)

    # -- rows --------------------------------------------------------------------------
    async def row(self, deployment: Deployment, sandbox_id: str) -> E2BSandbox:
        """The E2B row of the deployment's sandbox; a sandbox made through
        podbay's own API gets one the first time E2B's API names it."""
        row = await self.rows.get_e2b_sandbox(sandbox_id)
        if row is None:
            row = await self._adopt(deployment, sandbox_id)
        if row.deployment_id != deployment.id:
            raise sandbox_not_found(sandbox_id)
        return row

    async def _adopt(self, deployment: Deployment, sandbox_id: str) -> E2BSandbox:
        try:
            sandbox = await self.sandboxes.get(deployment, sandbox_id)
        except ApiError as exc:
            if exc.code is ErrorCode.SANDBOX_NOT_FOUND:
                raise sandbox_not_found(sandbox_id) from None
            raise
        row = adopted(sandbox, self.clock())
        await self.rows.add_e2b_sandbox(row)  # a replica racing here: its row stands
        found = await self.rows.get_e2b_sandbox(sandbox_id)
        return row if found is None else found

    async def create(
        self,
        deployment: Deployment,
        *,
        template: str,
        timeout_seconds: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        on_timeout: str = "kill",
        network: EgressPolicy | None = None,
    ) -> E2BSandbox:
        sandbox_id = new_sandbox_id()
        now = self.clock()
        row = E2BSandbox(
            sandbox_id=sandbox_id,
            deployment_id=deployment.id,
            template=template,
            metadata=metadata,
            env_vars=env_vars,
            started_at=now,
            end_at=now + timedelta(seconds=timeout_seconds),
            on_timeout=on_timeout,
        )
        seen = await self.template_view(deployment, template)
        options = create_options(metadata, env_vars)  # refuses bad env names first
        if network is not None:  # None: the deployment's default (its sandbox section)
            options = dataclasses.replace(options, network=network)
        await self.rows.add_e2b_sandbox(row)
        try:
            attached = await self.attach(seen, sandbox_id, options)
        except BaseException:
            await self.rows.delete_e2b_sandbox(sandbox_id)
            raise
        self._remember(sandbox_id, attached)  # the SDK's first command follows at once
        self.start_sweeper()
        return row

    async def attach(
        self, deployment: Deployment, sandbox_id: str, options: SandboxOptions = NO_OPTIONS
    ) -> Attached:
        """Create, resume or reuse the podbay sandbox, waiting out an environment
        build (E2B's create answers once the sandbox runs) for at most
        :data:`BUILD_HOLD_SECONDS`, then a refusal the SDK retries (the build
        goes on). Only the create names ``options``: a later attach naming
        none reaches it as it is."""
        deadline = asyncio.get_running_loop().time() + BUILD_HOLD_SECONDS
        while True:
            result = await self.sandboxes.attach(deployment, sandbox_id, "default", options)
            if not isinstance(result, Building):
                return result
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                now = result.progress
                step = "" if now is None else f" (step {now.step} of {now.steps}: {now.doing})"
                raise E2BError(
                    503,
                    "E2B_TEMPLATE_BUILDING",
                    f"the sandbox's environment is still being built{step}; "
                    "it goes on: ask again (the SDK does, within its request_timeout)",
                    BUILD_RETRY_SECONDS,
                )
            wait = min(result.retry_after_seconds, left)
            if result.done is not None:
                await asyncio.wait({result.done}, timeout=wait)
            else:
                await asyncio.sleep(wait)

    async def template_view(self, deployment: Deployment, template: str) -> Deployment:
        return await templates.resolve(self.store, deployment, template)

    async def reach(
        self,
        deployment: Deployment,
        sandbox_id: str,
        row: E2BSandbox | None = None,
        *,
        timeout_seconds: int = DEFAULT_TIMEOUT,
    ) -> Attached:
        """The data plane of an existing sandbox (resumed if it was suspended);
        one deleted through podbay's own API is gone here too. A sandbox that
        was paused runs ``timeout_seconds`` from now (E2B's connect; traffic
        that resumes it gives the default)."""
        try:
            sandbox = await self.sandboxes.get(deployment, sandbox_id)
        except ApiError as exc:
            if exc.code is ErrorCode.SANDBOX_NOT_FOUND:
                await self.rows.delete_e2b_sandbox(sandbox_id)
                raise sandbox_not_found(sandbox_id) from None
            raise
        if row is None:
            row = await self.row(deployment, sandbox_id)
        cached = self._attached.get(sandbox_id)
        if (
            cached is not None
            and row.paused_at is None
            and sandbox.state is SandboxState.RUNNING
            and (cached.sandbox.incarnation, cached.sandbox.node)
            == (sandbox.incarnation, sandbox.node)
            and cached.expires_at > self.clock() + CREDENTIAL_MARGIN
        ):
            # The record says the machine this credential names still runs:
            # the attach (a lease, a write, a signature) would change nothing.
            return cached
        try:
            seen = await self.template_view(deployment, row.template)
        except E2BError:
            seen = deployment  # its template's deployment is gone: a resume needs none
        attached = await self.attach(seen, sandbox_id)
        self._remember(sandbox_id, attached)
        if row.paused_at is not None:
            end = self.clock() + timedelta(seconds=timeout_seconds)
            await self.rows.set_e2b_paused(sandbox_id, None, end)
            self.start_sweeper()
        return attached

    def _remember(self, sandbox_id: str, attached: Attached) -> None:
        if len(self._attached) >= MAX_REMEMBERED:
            self._attached.clear()
        self._attached[sandbox_id] = attached

    async def pause(self, deployment: Deployment, sandbox_id: str) -> None:
        """podbay's stop (suspend: memory and files kept); no timeout applies
        until a connect, or a call of the sandbox API, resumes it."""
        await self.row(deployment, sandbox_id)
        self._attached.pop(sandbox_id, None)
        try:
            await self.sandboxes.stop(deployment, sandbox_id)
        except ApiError as exc:
            if exc.code is ErrorCode.SANDBOX_NOT_FOUND:
                await self.rows.delete_e2b_sandbox(sandbox_id)
                raise sandbox_not_found(sandbox_id) from None
            raise
        await self.rows.set_e2b_paused(sandbox_id, self.clock())

    async def kill(self, deployment: Deployment, sandbox_id: str) -> None:
        await self.row(deployment, sandbox_id)
        self._attached.pop(sandbox_id, None)
        with contextlib.suppress(ApiError):  # already gone through podbay's API
            await self.sandboxes.delete(deployment, sandbox_id)
        await self.rows.delete_e2b_sandbox(sandbox_id)

    async def set_timeout(self, deployment: Deployment, sandbox_id: str, seconds: int) -> None:
        await self.row(deployment, sandbox_id)
        await self.rows.set_e2b_end(sandbox_id, self.clock() + timedelta(seconds=seconds))
        self.start_sweeper()

    # -- E2B's timeout: the sandbox is killed at its end ----------------------------------
    def start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except Exception:
                log.exception("killing expired E2B sandboxes failed")

    async def sweep(self) -> None:
        """Kill, or pause (``on_timeout``), every sandbox past its end; one that
        fails is logged and tried again at the next sweep, the others go on."""
        for row in await self.rows.list_e2b_sandboxes(ended_by=self.clock()):
            deployment = await self.store.get_deployment(row.deployment_id)
            try:
                if deployment is None:
                    await self.rows.delete_e2b_sandbox(row.sandbox_id)
                elif row.on_timeout == "pause":
                    await self.pause(deployment, row.sandbox_id)
                else:
                    await self.kill(deployment, row.sandbox_id)
            except E2BError as exc:
                if exc.code != "SANDBOX_NOT_FOUND":
                    log.warning("E2B timeout of %s: %s", row.sandbox_id, exc.message)
            except Exception:
                log.exception("the E2B timeout of sandbox %s failed", row.sandbox_id)

    async def close(self) -> None:
        for closer in self.closers:
            closer()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper
        await self.http.aclose()


def create_options(metadata: dict[str, str], env_vars: dict[str, str]) -> SandboxOptions:
    """E2B's ``envVars`` are podbay's create-time ``env`` (so podbay's own API
    runs with them too); its ``metadata`` are the sandbox's labels when every
    pair can be one (E2B's metadata is free-form; then it stays E2B's only)."""
    check_env(env_vars)
    try:
        check_labels(metadata)
        labels = metadata
    except ApiError:
        labels = {}
    return SandboxOptions(labels=labels, env=env_vars)


def adopted(sandbox: Sandbox, now: datetime) -> E2BSandbox:
    """The E2B row of a sandbox made through podbay's own API: template
    ``base``, its labels as metadata, and E2B's longest timeout with ``pause``
    at its end (podbay's own API never deletes a sandbox on a timer)."""
    return E2BSandbox(
        sandbox_id=sandbox.name,
        deployment_id=sandbox.deployment_id,
        template=templates.BASE,
        metadata=dict(sandbox.options.labels),
        env_vars=dict(sandbox.options.env),
        started_at=sandbox.created_at,
        end_at=now + timedelta(seconds=MAX_TIMEOUT),
        on_timeout="pause",
    )


def sandbox_not_found(sandbox_id: str) -> E2BError:
    # "was not found" is what E2B's SDK looks for to raise SandboxNotFound / NotRunning.
    return E2BError(404, "SANDBOX_NOT_FOUND", f"sandbox {sandbox_id} was not found")
