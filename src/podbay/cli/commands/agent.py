"""``podbay agent``: run the sandbox agent (normally the runtime does this
inside each sandbox; here for local debugging). Forwards its options to
:func:`podbay.agent.__main__.main`, which inside a sandbox runs without click.
"""

from __future__ import annotations

import click


@click.command(name="agent", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", metavar="PATH", help="Serve on a new unix socket.")
@click.option("--listen", metavar="HOST:PORT", help="Serve on TCP (local debugging).")
@click.option("--fd", type=int, metavar="N", help="Serve on an inherited listening socket.")
@click.option("--workspace", metavar="DIR", help="Default cwd and base of relative paths.")
@click.option("--env-file", metavar="PATH", help="JSON object of variables for every command.")
def command(
    socket_path: str | None,
    listen: str | None,
    fd: int | None,
    workspace: str | None,
    env_file: str | None,
) -> None:
    """Run the sandbox agent: exec, processes and files over HTTP/1.1."""
    from podbay.agent.__main__ import main

    argv: list[str] = []
    for flag, value in (
        ("--socket", socket_path),
        ("--listen", listen),
        ("--fd", fd),
        ("--workspace", workspace),
        ("--env-file", env_file),
    ):
        if value is not None:
            argv += [flag, str(value)]
    raise SystemExit(main(argv))
