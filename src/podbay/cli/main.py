"""``podbay``: the command line. Each subcommand lives in ``commands/<name>.py``
and is imported only when used, so ``podbay agent`` starts fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import re

import click

#: subcommand → module defining a click command or group named ``command``.
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("podbay.cli.commands.agent", "Run the sandbox agent (inside a sandbox)."),
    "serve": ("podbay.cli.commands.serve", "Run the whole platform on this machine."),
    "deployment": ("podbay.cli.commands.deployment", "Register deployments, issue tokens."),
    "admin": ("podbay.cli.commands.admin", "Operator tokens for the web console and admin API."),
    "control": ("podbay.cli.commands.control", "Run the control plane alone (a cluster replica)."),
    "node": (
        "podbay.cli.commands.node",
        "Run a cluster's sandbox host; list, drain, forget nodes.",
    ),
    "sandbox": ("podbay.cli.commands.sandbox", "Use sandboxes: exec, run, cp, ls..."),
    "volume": ("podbay.cli.commands.volume", "Persistent volumes: create, ls, rm..."),
    "doctor": ("podbay.cli.commands.doctor", "Check this host can run sandboxes."),
    "gc": ("podbay.cli.commands.gc", "Remove what dead sandboxes left behind."),
    "dev": ("podbay.cli.commands.dev", "Local development: real sandboxes for your agent."),
    "mcp": ("podbay.cli.commands.mcp", "Serve sandboxes as MCP tools (stdio or HTTP)."),
    "completion": ("podbay.cli.commands.completion", "Print a shell's completion script."),
}
#: Subcommands that need the ``server`` extra (``pip install podbay`` is the SDK
#: and the client-side commands only).
SERVER_COMMANDS = frozenset(
    {"serve", "control", "node", "deployment", "admin", "doctor", "gc", "dev"}
)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in COMMANDS.items() if _exists(module))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _exists(entry[0]):
            return None
        if cmd_name in SERVER_COMMANDS and _missing_server_extra():
            raise click.ClickException(
                f"podbay {cmd_name} needs the server extra: pip install 'podbay[server]'"
            )
        command = importlib.import_module(entry[0]).command
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _exists(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _missing_server_extra() -> bool:
    """Whether a distribution the ``server`` extra requires is not installed
    (read from podbay's own metadata, so the list lives in pyproject.toml only)."""
    from importlib import metadata

    try:
        requires = metadata.requires("podbay") or []
    except metadata.PackageNotFoundError:  # run from a source tree: nothing to check
        return False
    for requirement in requires:
        name, _, marker = requirement.partition(";")
        if not re.search(r"extra\s*==\s*[\"']server[\"']", marker):
            continue
        match = re.match(r"[A-Za-z0-9._-]+", name.strip())
        try:
            metadata.distribution(match.group(0) if match else name)
        except metadata.PackageNotFoundError:
            return True
    return False


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="podbay")
def cli() -> None:
    """podbay: self-hostable sandboxes for AI agents."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
