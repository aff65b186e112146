"""Shell completion of sandbox names (click's: ``_PODBAY_COMPLETE=bash_source
podbay``, or ``podbay completion bash``).

A NAME argument completes to the deployment's sandboxes, listed with the
token and server the command line has so far (``--token``, ``--server`` or
their environment variables). Completion must never get in the way: any
failure (no token, no server) completes to nothing.
"""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem

#: The parameter names of a sandbox NAME argument.
NAME_PARAMS = frozenset({"name", "sandbox_name"})
#: How long a completion waits for the server: a person is waiting at a prompt.
COMPLETION_TIMEOUT_SECONDS = 3.0


def sandbox_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """The deployment's sandbox names that start with ``incomplete``."""
    from podbay.client import SandboxClient

    try:
        with SandboxClient(
            identity_token=ctx.params.get("token"),
            server_url=ctx.params.get("server"),
            timeout_seconds=COMPLETION_TIMEOUT_SECONDS,
        ) as client:
            names = [r.name for r in client.list()]
    except Exception:  # noqa: BLE001 - completion must never print into the shell (module doc)
        return []
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def completing_names(group: click.Group) -> None:
    """Give every NAME argument of ``group``'s commands :func:`sandbox_names`."""
    for sub in group.commands.values():
        for param in sub.params:
            if isinstance(param, click.Argument) and param.name in NAME_PARAMS:
                # click keeps a parameter's completer here (what its
                # ``shell_complete=`` argument sets); set after the fact so the
                # commands' declarations stay as they are.
                param._custom_shell_complete = sandbox_names
