"""A deleted deployment's sandboxes stop answering at once.

Deployments are deleted through the CLI, which works on the store directly
(another process), and the server's lifecycle pass destroys their
sandboxes up to one interval later. Until then their credentials would
still reach them. So whoever deletes a deployment replaces a marker file
(:func:`mark_deleted`), and the gateway, before relaying, compares that
file's identity with the last one seen (one ``stat``): on a change it drops
the route of every ``deleting`` sandbox, and its credentials are refused
(401 ``SANDBOX_NOT_RUNNING``; re-attaching then fails on the identity token).

In a cluster the gateways are the nodes', on other machines: the deleting
command itself withdraws the routes on every node that holds one of the
deployment's sandboxes (:func:`withdraw_deleted`), before it returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from podbay.domain import SandboxState
from podbay.store.base import Store

from ..nodes import Nodes

log = logging.getLogger("podbay.lifecycle")
MARKER_NAME = "deployments.deleted"


def marker_path(data_dir: Path) -> Path:
    return data_dir / MARKER_NAME


def mark_deleted(marker: Path) -> None:
    """Tell a running server that a deployment is gone (a new file each time,
    so its inode changes even within one clock tick)."""
    temp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    temp.write_text(f"{time.time_ns()}\n")
    os.replace(temp, marker)


class DeletionWatch:
    def __init__(self, marker: Path, store: Store, nodes: Nodes) -> None:
        self.marker = marker
        self.store = store
        self.nodes = nodes
        self._seen = self._stamp()
        self._reload: asyncio.Future[None] | None = None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.marker)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    async def check(self) -> None:
        """Drop deleted deployments' routes if a deletion happened since the last check."""
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            self._reload = asyncio.ensure_future(self._drop_deleted())
        if self._reload is not None and not self._reload.done():
            # Every request that arrives meanwhile waits for the same reload.
            await asyncio.shield(self._reload)

    async def _drop_deleted(self) -> None:
        try:
            for row in await self.store.list_sandboxes(states=[SandboxState.DELETING]):
                await self.nodes.of(row).withdraw(row.id)
        except Exception:
            log.exception("could not read deleted deployments' sandboxes; retrying")
            self._seen = None  # the next request tries again


async def withdraw_deleted(store: Store, nodes: Nodes, deployment_id: str) -> list[str]:
    """Withdraw, on the node that holds it, the route of each of a deleted
    deployment's sandboxes (all ``deleting`` now). Returns the nodes that
    could not be told (lost, or not answering): their sandboxes answer until
    a lifecycle pass destroys them. Rows on no enrolled node (``serve``'s,
    whose gateway watches the marker) are not this function's."""
    await nodes.refresh()
    enrolled = {node.name for node in nodes.all()}
    missed: list[str] = []
    for row in await store.list_sandboxes(
        deployment_id=deployment_id, states=[SandboxState.DELETING]
    ):
        if row.node not in enrolled:
            continue
        try:
            await nodes.of(row).withdraw(row.id)
        # Logged; one node's failure must not keep the others' routes.
        except Exception as exc:  # noqa: BLE001
            log.warning("sandbox %s: node %s kept its route: %s", row.id, row.node, exc)
            missed.append(row.node)
    return sorted(set(missed))
