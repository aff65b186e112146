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
import logging
import secrets
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

import httpx

from podbay.control.services.environment import Building
from podbay.control.services.options import check_env, check_labels
from podbay.control.services.sandboxes import Attached, SandboxService
from podbay.domain import Deployment, SandboxOptions
from podbay.domain.options import NO_OPTIONS
from podbay.errors import ApiError
from podbay.store.e2b import E2BSandbox, E2BStore
from podbay.wire.codes import ErrorCode

from .errors import E2BError
from .keys import KEY_PATTERN, SECRET_META_KEY, key_hash, new_api_key, new_secret, token_matches

if TYPE_CHECKING:
    from podbay.store.base import Store

log = logging.getLogger("podbay.e2b")
#: E2B ids are lowercase letters and digits; 20 of them carry ~103 random bits.
_ID_ALPHABET = string.ascii_lowercase + string.digits
#: How often expired sandboxes (past their E2B timeout) are looked for.
SWEEP_SECONDS = 1.0


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
    ) -> None:
        self.store = store
        self.rows = cast(E2BStore, store)
        self.sandboxes = sandboxes
        self.clock = clock
        self._secret: str | None = None
        self._sweeper: asyncio.Task[None] | None = None
        #: Called on close: the sandbox API's own state (its processes' timers).
        self.closers: list[Callable[[], None]] = []
        #: The data plane is reached over HTTP, as any client reaches it: in a
        #: cluster the endpoint is the sandbox's node, never this process.
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))

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

    async def authorize(
        self, sandbox_id: str, access: str | None, api_key: str | None
    ) -> tuple[Deployment, E2BSandbox]:
        """The sandbox a data-plane request may reach: its access token, or an
        API key of its deployment. Another deployment's sandbox is "not found"."""
        if access is not None:
            if not token_matches(await self.secret(), sandbox_id, access):
                raise E2BError(401, "E2B_ACCESS_TOKEN_INVALID", "invalid access token")
            row = await self.rows.get_e2b_sandbox(sandbox_id)
            deployment = None if row is None else await self.store.get_deployment(row.deployment_id)
            if row is None or deployment is None:
                raise sandbox_not_found(sandbox_id)
            return deployment, row
        if api_key is None:
            raise E2BError(
                401, "E2B_ACCESS_TOKEN_MISSING", "an access token is required (X-Access-Token)"
            )
        deployment = await self.deployment_for_key(api_key)
        return deployment, await self.row(deployment, sandbox_id)

    # -- rows --------------------------------------------------------------------------
    async def row(self, deployment: Deployment, sandbox_id: str) -> E2BSandbox:
        row = await self.rows.get_e2b_sandbox(sandbox_id)
        if row is None or row.deployment_id != deployment.id:
            raise sandbox_not_found(sandbox_id)
        return row

    async def create(
        self,
        deployment: Deployment,
        *,
        template: str,
        timeout_seconds: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
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
        )
        options = create_options(metadata, env_vars)  # refuses bad env names first
        await self.rows.add_e2b_sandbox(row)
        try:
            await self.attach(deployment, sandbox_id, options)
        except BaseException:
            await self.rows.delete_e2b_sandbox(sandbox_id)
            raise
        self.start_sweeper()
        return row

    async def attach(
        self, deployment: Deployment, sandbox_id: str, options: SandboxOptions = NO_OPTIONS
    ) -> Attached:
        """Create, resume or reuse the podbay sandbox, waiting out an environment
        build (E2B's create answers once the sandbox runs). Only the create
        names ``options``: a later attach naming none reaches it as it is."""
        while True:
            result = await self.sandboxes.attach(deployment, sandbox_id, "default", options)
            if not isinstance(result, Building):
                return result
            if result.done is not None:
                await asyncio.wait({result.done}, timeout=result.retry_after_seconds)
            else:
                await asyncio.sleep(result.retry_after_seconds)

    async def reach(self, deployment: Deployment, sandbox_id: str) -> Attached:
        """The data plane of an existing sandbox (resumed if it was suspended);
        one deleted through podbay's own API is gone here too."""
        try:
            await self.sandboxes.get(deployment, sandbox_id)
        except ApiError as exc:
            if exc.code is ErrorCode.SANDBOX_NOT_FOUND:
                await self.rows.delete_e2b_sandbox(sandbox_id)
                raise sandbox_not_found(sandbox_id) from None
            raise
        return await self.attach(deployment, sandbox_id)

    async def kill(self, deployment: Deployment, sandbox_id: str) -> None:
        await self.row(deployment, sandbox_id)
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
        for row in await self.rows.list_e2b_sandboxes(ended_by=self.clock()):
            deployment = await self.store.get_deployment(row.deployment_id)
            if deployment is None:
                await self.rows.delete_e2b_sandbox(row.sandbox_id)
                continue
            await self.kill(deployment, row.sandbox_id)

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


def sandbox_not_found(sandbox_id: str) -> E2BError:
    # "was not found" is what E2B's SDK looks for to raise SandboxNotFound / NotRunning.
    return E2BError(404, "SANDBOX_NOT_FOUND", f"sandbox {sandbox_id} was not found")
