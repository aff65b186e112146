"""Deployments: registered from an astropods.yml, authenticated by identity token.

Used by the CLI (``podbay deployment ...``, straight on the store, also while
``serve`` runs) and by the control plane (authentication).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from podbay.domain import Deployment
from podbay.domain.deployment import DEFAULT_ACCOUNT, new_deployment_id
from podbay.errors import ApiError
from podbay.errors import DeploymentError as DeploymentError  # re-exported: defined in the one tree
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import is_valid_sandbox_name

from ..keys import KeyRing, StoreKeyRing
from ..tokens import IdentityTokens, issue_identity_token
from .deletions import mark_deleted

PUBLIC_URL_KEY = "public_url"

#: Checks a raw ``sandbox`` section; raises ``ValueError`` naming the field.
#: What it returns (the parsed section) is not used here: the environment
#: service parses the stored spec again when it builds.
SectionValidator = Callable[[dict[str, Any]], object]


def parse_astropods(text: str) -> dict[str, Any] | None:
    """The raw ``sandbox`` section of an astropods.yml, ``None`` when absent.

    >>> parse_astropods("name: x\\nsandbox:\\n  toolchain: auto\\n")
    {'toolchain': 'auto'}
    >>> parse_astropods("name: x\\n") is None
    True
    """
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise DeploymentError(f"the spec is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DeploymentError("the spec must be a YAML mapping (astropods.yml)")
    if "sandbox" not in data:
        return None
    section = data["sandbox"]
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise DeploymentError("sandbox: must be a mapping")
    return section


class DeploymentService:
    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        store: Store,
        keys: KeyRing | StoreKeyRing,
        *,
        issuer: str,
        identity_ttl_seconds: int = 0,
        validate_section: SectionValidator | None = None,
        deleted_marker: Path | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        refresh_keys: Callable[[], Awaitable[bool]] | None = None,
        after_delete: Callable[[Deployment], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        #: Re-reads shared keys (True when it did): a token signed by a key
        #: another replica or the CLI just made is checked again after it.
        self.refresh_keys = refresh_keys
        self.issuer = issuer
        self.identity_tokens = IdentityTokens(keys, issuer)
        self.identity_ttl_seconds = identity_ttl_seconds
        self.validate_section = validate_section
        #: Replaced after each delete: a running server drops the routes of
        #: the deployment's sandboxes at once (services/deletions.py).
        self.deleted_marker = deleted_marker
        #: Run after each delete: in a cluster, the nodes withdraw the routes of
        #: the deployment's sandboxes at once (services/deletions.py).
        self.after_delete = after_delete
        self.clock = clock

    def _section(self, spec_text: str) -> dict[str, Any] | None:
        section = parse_astropods(spec_text)
        if section is not None and self.validate_section is not None:
            try:
                self.validate_section(section)
            except ValueError as exc:
                raise DeploymentError(str(exc)) from None
        return section

    def token_for(self, deployment: Deployment) -> str:
        return issue_identity_token(
            self.keys,
            deployment_id=deployment.id,
            issuer=self.issuer,
            ttl_seconds=self.identity_ttl_seconds,
        )

    async def create(
        self, name: str, spec_text: str, account: str = DEFAULT_ACCOUNT
    ) -> tuple[Deployment, str]:
        if not is_valid_sandbox_name(name):
            raise DeploymentError("deployment names match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
        if not is_valid_sandbox_name(account):
            raise DeploymentError("account names match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
        now = self.clock()
        deployment = Deployment(
            id=new_deployment_id(),
            name=name,
            account=account,
            spec_text=spec_text,
            sandbox_section=self._section(spec_text),
            created_at=now,
            updated_at=now,
        )
        if not await self.store.add_deployment(deployment):
            raise DeploymentError(f"a deployment named {name!r} exists")
        return deployment, self.token_for(deployment)

    async def update(self, name: str, spec_text: str) -> Deployment:
        old = await self.get(name)
        new = replace(
            old,
            spec_text=spec_text,
            sandbox_section=self._section(spec_text),
            updated_at=self.clock(),
        )
        if not await self.store.update_deployment(new):
            raise DeploymentError(f"no deployment named {name!r}")
        return new

    async def get(self, name: str) -> Deployment:
        deployment = await self.store.find_deployment(name)
        if deployment is None:
            raise DeploymentError(f"no deployment named {name!r}")
        return deployment

    async def token(self, name: str) -> str:
        return self.token_for(await self.get(name))

    async def list(self) -> list[Deployment]:
        return await self.store.list_deployments()

    async def delete(self, name: str) -> Deployment:
        """Drop it; its sandboxes are marked ``deleting``, stop answering at once,
        and are destroyed by the server's next lifecycle pass."""
        deployment = await self.get(name)
        await self.store.remove_deployment(deployment.id)
        if self.deleted_marker is not None:
            mark_deleted(self.deleted_marker)
        if self.after_delete is not None:
            await self.after_delete(deployment)
        return deployment

    # -- the control plane's side ----------------------------------------------------
    async def authenticate(self, token: str | None) -> Deployment:
        try:
            deployment_id = self.identity_tokens.verify(token)
        except ApiError:
            if self.refresh_keys is None or not await self.refresh_keys():
                raise
            deployment_id = self.identity_tokens.verify(token)
        deployment = await self.store.get_deployment(deployment_id)
        if deployment is None:
            raise ApiError(
                ErrorCode.IDENTITY_TOKEN_INVALID, "the identity token's deployment no longer exists"
            )
        return deployment
