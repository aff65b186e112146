"""``podbay deployment``: register deployments and issue identity tokens.

Works on the data directory's store directly, so it works while ``podbay
serve`` runs. ``create`` and ``token`` print the token alone on stdout's
last line::

    export ASTRO_AUTHZ_TOKEN=$(podbay deployment create my-agent --spec astropods.yml)
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from podbay.cli import options
from podbay.cli.output import Output, fail
from podbay.cli.stores import run_on_store

if TYPE_CHECKING:
    from podbay.control.remote import ClusterNodes
    from podbay.domain import Deployment
    from podbay.settings import Settings
    from podbay.store.base import Store

T = TypeVar("T")

data_dir_option = options.data_dir_option(
    "The server's data directory (default /var/lib/podbay as root)."
)
json_option = options.json_option()


def with_service(
    data_dir: Path | None, work: Callable[[Any], Awaitable[T]], *, issuer: str | None = None
) -> T:
    """Open the store and key ring, build the service, run ``work(service)``.

    Tokens name ``issuer``, else the public URL the server recorded, else the
    settings' (a server checks that ``iss`` is its own URL).
    """
    from podbay.control.keys import open_keys
    from podbay.control.services.deletions import marker_path
    from podbay.control.services.deployments import (
        PUBLIC_URL_KEY,
        DeploymentError,
        DeploymentService,
    )
    from podbay.environment.spec import parse_section
    from podbay.settings import Settings

    settings = Settings.load(data_dir=data_dir)

    async def on_service(store: Store) -> T:
        named = issuer or await store.get_meta(PUBLIC_URL_KEY) or settings.server.base_url()
        keys = await open_keys(settings, store)
        nodes = cluster_nodes(settings, store, keys)
        marker: Path | None = marker_path(settings.data_dir)
        if nodes is not None and not settings.data_dir.is_dir():
            marker = None  # a cluster operator's machine: no server here watches it
        service = DeploymentService(
            store,
            keys,
            issuer=named,
            identity_ttl_seconds=settings.credentials.identity_ttl_seconds,
            validate_section=parse_section,
            deleted_marker=marker,
            after_delete=None if nodes is None else functools.partial(withdraw, store, nodes),
        )
        try:
            return await work(service)
        finally:
            if nodes is not None:
                await nodes.close()

    try:
        return run_on_store(settings, on_service)
    except DeploymentError as exc:
        fail(str(exc))


def cluster_nodes(settings: Settings, store: Store, keys: object) -> ClusterNodes | None:
    """The nodes of the cluster whose store this is, or None on one host (its
    gateway watches the deletion marker instead)."""
    from podbay.control.keys import StoreKeyRing

    if not isinstance(keys, StoreKeyRing):
        return None
    from podbay.control.remote import ClusterNodes
    from podbay.store.postgres import PostgresStore

    if not isinstance(store, PostgresStore):
        return None
    return ClusterNodes(
        store,
        keys,
        lost_after=settings.cluster.node_lost_seconds,
        clock=lambda: datetime.now(UTC),
    )


async def withdraw(store: Store, nodes: ClusterNodes, deployment: Deployment) -> None:
    """A deleted deployment's sandboxes refused on their nodes now, not at a
    control replica's next lifecycle pass."""
    from podbay.control.services.deletions import withdraw_deleted

    for node in await withdraw_deleted(store, nodes, deployment.id):
        Output().info(
            f"podbay: warning: node {node} did not answer; its sandboxes of "
            f"{deployment.name} answer until a control replica destroys them"
        )


def read_spec(spec: str | None) -> str:
    if spec is None:
        return ""
    if spec == "-":
        return sys.stdin.read()
    try:
        return Path(spec).read_text()
    except OSError as exc:
        fail(f"cannot read {spec}: {exc.strerror}")


# Alike in shape to podbay.dataplane.nodeapi's deployment_doc by nature (a deployment's
# fields as a dict), for another reader: this one is what an operator sees.
def _row(d: Any) -> dict[str, Any]:
    return {
        "name": d.name,
        "id": d.id,
        "account": d.account,
        "sandbox": d.declares_sandbox,
        "created_at": d.created_at,
    }


@click.group()
def command() -> None:
    """Register deployments and issue their identity tokens."""


@command.command()
@click.argument("name")
@click.option("--spec", default=None, metavar="FILE|-", help="The deployment's astropods.yml.")
@click.option("--account", default="default", help="Account the deployment counts against.")
@click.option("--e2b-key", is_flag=True, help="Also issue an E2B API key (printed last).")
@data_dir_option
@json_option
def create(
    name: str, spec: str | None, account: str, e2b_key: bool, data_dir: Path | None, as_json: bool
) -> None:
    """Register NAME; print its identity token (last line of stdout), then
    with ``--e2b-key`` an E2B API key for it (the last line instead)."""
    text = read_spec(spec)

    async def work(service: Any) -> tuple[Deployment, str, str | None]:
        from podbay.e2b.service import issue_key

        deployment, token = await service.create(name, text, account)
        key = await issue_key(service.store, deployment) if e2b_key else None
        return deployment, token, key

    deployment, token, key = with_service(data_dir, work)
    out = Output(as_json=as_json)
    if as_json:
        out.value({**_row(deployment), "token": token, **({"e2b_key": key} if key else {})})
        return
    if not deployment.declares_sandbox:
        out.info(f"podbay: note: {name} declares no sandbox section; attach will answer 409")
    out.line(token)
    if key is not None:
        out.line(key)


@command.command("e2b-key")
@click.argument("name")
@click.option("--revoke", is_flag=True, help="Revoke every E2B API key of NAME instead.")
@data_dir_option
def e2b_key_(name: str, revoke: bool, data_dir: Path | None) -> None:
    """Issue an E2B API key for NAME (printed alone on the last line); with
    ``--revoke``, revoke all of NAME's keys at once."""

    async def work(service: Any) -> str:
        from podbay.e2b.service import issue_key, revoke_keys

        deployment = await service.get(name)
        if revoke:
            return f"revoked {await revoke_keys(service.store, deployment)} E2B key(s) of {name}"
        return await issue_key(service.store, deployment)

    result = with_service(data_dir, work)
    if revoke:
        Output().info(result)
    else:
        Output().line(result)


@command.command()
@click.argument("name")
@click.option("--spec", required=True, metavar="FILE|-", help="The new astropods.yml.")
@data_dir_option
@json_option
def update(name: str, spec: str, data_dir: Path | None, as_json: bool) -> None:
    """Replace NAME's astropods.yml; new sandboxes use it."""
    text = read_spec(spec)
    deployment = with_service(data_dir, lambda s: s.update(name, text))
    Output(as_json=as_json).value(_row(deployment), f"updated {name}")


@command.command()
@click.argument("name")
@data_dir_option
def token(name: str, data_dir: Path | None) -> None:
    """Issue another identity token for NAME."""
    Output().line(with_service(data_dir, lambda s: s.token(name)))


@command.command("list")
@data_dir_option
@json_option
def list_(data_dir: Path | None, as_json: bool) -> None:
    """Every registered deployment."""
    deployments = with_service(data_dir, lambda s: s.list())
    rows = [_row(d) for d in deployments]
    Output(as_json=as_json).table(
        [(r["name"], r["account"], "yes" if r["sandbox"] else "no", r["id"]) for r in rows],
        ["NAME", "ACCOUNT", "SANDBOX", "ID"],
        data=rows,
    )


@command.command()
@click.argument("name")
@data_dir_option
def delete(name: str, data_dir: Path | None) -> None:
    """Delete NAME: its tokens stop working, its sandboxes are destroyed."""
    with_service(data_dir, lambda s: s.delete(name))
    Output().info(f"deleted {name}; a running server destroys its sandboxes on its next pass")


@command.group()
def keys() -> None:
    """Signing keys of identity tokens and credentials."""


def _with_keys(data_dir: Path | None, work: Callable[[Any], Awaitable[T] | T]) -> T:
    """Run ``work(ring)`` on the key ring the settings name: the data directory's,
    or the shared store's (``PODBAY_STORE_URL``), whose rotations every replica
    and node picks up."""
    import inspect

    from podbay.control.keys import KeyRingError, open_keys
    from podbay.settings import Settings

    settings = Settings.load(data_dir=data_dir)

    async def on_keys(store: Store) -> T:
        result = work(await open_keys(settings, store))
        if inspect.isawaitable(result):
            return await result
        return result

    try:
        return run_on_store(settings, on_keys)
    except KeyRingError as exc:
        fail(str(exc))


@keys.command("list")
@data_dir_option
def keys_list(data_dir: Path | None) -> None:
    def show(ring: Any) -> None:
        active = ring.active().kid
        Output().table(
            [(kid, "active" if kid == active else "") for kid in ring.kids()], ["KID", ""]
        )

    _with_keys(data_dir, show)


@keys.command("rotate")
@data_dir_option
def keys_rotate(data_dir: Path | None) -> None:
    """A new signing key; tokens signed by older keys keep verifying."""
    Output().line(_with_keys(data_dir, lambda ring: ring.rotate()))


@keys.command("remove")
@click.argument("kid")
@data_dir_option
def keys_remove(kid: str, data_dir: Path | None) -> None:
    """Remove a key: tokens it signed stop verifying (within a second)."""
    _with_keys(data_dir, lambda ring: ring.remove(kid))
