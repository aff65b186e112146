"""``podbay completion bash|zsh|fish``: the shell's completion script.

    eval "$(podbay completion bash)"      # in ~/.bashrc

The script is click's (the same as ``_PODBAY_COMPLETE=bash_source podbay``);
sandbox NAME arguments complete to the deployment's sandboxes
(:mod:`podbay.cli.completion`).
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

#: The variable the script sets when it asks ``podbay`` for completions.
COMPLETE_VAR = "_PODBAY_COMPLETE"


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def command(shell: str) -> None:
    """Print the completion script of SHELL (eval it in the shell's rc file)."""
    from podbay.cli.main import cli

    cls = get_completion_class(shell)
    assert cls is not None  # the choices are click's own shells
    click.echo(cls(cli, {}, "podbay", COMPLETE_VAR).source())
