"""``podbay mcp``: serve podbay's sandboxes as Model Context Protocol tools.

    podbay mcp                                # stdio (what MCP hosts launch)
    podbay mcp --transport http --port 8765   # streamable HTTP, http://127.0.0.1:8765/mcp

Over HTTP every request must carry ``Authorization: Bearer <secret>``: the
secret is ``$PODBAY_MCP_SECRET``, or one generated and printed once to stderr.

Needs the ``mcp`` extra: ``pip install 'podbay[mcp]'``.
"""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="HTTP only. Whoever reaches it with its secret uses your token's sandboxes.",
)
@click.option("--port", type=int, default=8765, show_default=True, help="HTTP only.")
@click.option("--path", default="/mcp", show_default=True, help="HTTP only.")
@click.option("--token", envvar="ASTRO_AUTHZ_TOKEN", help="Identity token [ASTRO_AUTHZ_TOKEN].")
@click.option("--server", "server_url", help="Server URL (default: the token's iss).")
def command(
    transport: str, host: str, port: int, path: str, token: str | None, server_url: str | None
) -> None:
    """Serve podbay as MCP tools: exec, run, files, processes, run_code."""
    try:
        from podbay.integrations import mcp as integration
    except ImportError as exc:
        raise click.ClickException(
            f"podbay mcp needs the mcp extra: pip install 'podbay[mcp]' ({exc})"
        ) from exc
    import anyio

    from podbay.client import AsyncSandboxClient
    from podbay.errors import PodbayError

    try:
        client = AsyncSandboxClient(identity_token=token, server_url=server_url)
    except PodbayError as exc:
        raise click.ClickException(str(exc)) from exc
    anyio.run(lambda: integration.serve(client, transport, host=host, port=port, path=path))
