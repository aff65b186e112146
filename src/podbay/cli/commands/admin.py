"""``podbay admin token``: an operator token, for the web console's sign-in
and the operator's API (``/api/v1/deployments``, ``/api/v1/nodes``).

Signed with the server's keys like identity tokens, so it works on the
server whose data directory (or shared store) this is. It expires after
``--ttl`` seconds (30 days by default; 0: never). ``--revoke-all`` revokes
every operator token and operator console session issued so far, on every
replica within a second; removing the signing key (``podbay deployment keys
remove``) revokes them too, with every other token that key signed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from podbay.cli import options
from podbay.cli.output import Output
from podbay.cli.stores import run_on_store

if TYPE_CHECKING:
    from podbay.store.base import Store

data_dir_option = options.data_dir_option(
    "The server's data directory (default /var/lib/podbay as root)."
)


@click.group()
def command() -> None:
    """The operator's tokens."""


@command.command()
@click.option(
    "--ttl",
    type=click.IntRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Lifetime of the token (default 30 days; 0: it never expires).",
)
@click.option(
    "--revoke-all",
    is_flag=True,
    help="Revoke every operator token and console session issued so far instead.",
)
@data_dir_option
def token(ttl: int | None, revoke_all: bool, data_dir: Path | None) -> None:
    """Issue an operator token (printed alone on the last line of stdout)."""
    from podbay.console.tokens import OPERATOR_TOKEN_SECONDS, Generation, issue_operator_token
    from podbay.control.keys import open_keys
    from podbay.control.services.deployments import PUBLIC_URL_KEY
    from podbay.settings import Settings

    settings = Settings.load(data_dir=data_dir)

    async def work(store: Store) -> str:
        generation = Generation(store)
        if revoke_all:
            await generation.bump()
            return "revoked every operator token and operator console session"
        issuer = await store.get_meta(PUBLIC_URL_KEY) or settings.server.base_url()
        keys = await open_keys(settings, store)
        issued, _ = issue_operator_token(
            keys,
            issuer=issuer,
            generation=await generation.current(),
            ttl_seconds=OPERATOR_TOKEN_SECONDS if ttl is None else ttl,
        )
        return issued

    result = run_on_store(settings, work)
    if revoke_all:
        Output().info(result)
    else:
        Output().line(result)
