"""The ``podbay sandbox`` group and what each of its verbs shares: the
connection options (--token, --server, --json) and the session that turns
every expected failure into one line and an exit code. The verbs live in
:mod:`.sandbox` and :mod:`.observe`, which both add to :func:`command`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from podbay.cli.output import Output, fail
from podbay.client._config import TOKEN_ENV

if TYPE_CHECKING:
    from podbay.client import SandboxClient


@click.group()
def command() -> None:
    """Use sandboxes: exec, run, cp, ls, list..."""


@dataclass(frozen=True)
class Connection:
    """Where and as whom every subcommand talks (--token, --server), and how it prints (--json)."""

    token: str | None
    server: str | None
    as_json: bool


def _options(func: Callable[..., None]) -> Callable[..., None]:
    """--token, --server and --json on every subcommand, handed to it as one
    ``conn`` (:class:`Connection`)."""

    @functools.wraps(func)
    def with_connection(
        *args: Any, token: str | None, server: str | None, as_json: bool, **kwargs: Any
    ) -> None:
        func(*args, conn=Connection(token, server, as_json), **kwargs)

    wrapped: Callable[..., None] = with_connection
    wrapped = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")(
        wrapped
    )
    # Alike in shape to dev.py's options by nature (click declarations).
    wrapped = click.option(
        "--server",
        envvar="PODBAY_SERVER_URL",
        default=None,
        metavar="URL",
        help="Control plane URL (default: the token's iss).",
    )(wrapped)
    wrapped = click.option(
        "--token",
        envvar="ASTRO_AUTHZ_TOKEN",
        default=None,
        help="Identity token (default: $ASTRO_AUTHZ_TOKEN).",
    )(wrapped)
    return wrapped


@contextlib.contextmanager
def _session(conn: Connection, **options: Any) -> Iterator[tuple[SandboxClient, Output]]:
    """A client and an output; every expected failure becomes one line and an exit code."""
    import httpx

    from podbay.cli.progress import preparing_lines
    from podbay.client import SandboxClient
    from podbay.errors import SandboxRequestError, SandboxUnavailableError, shell_exit_code

    out = Output(as_json=conn.as_json)
    if not conn.token:
        fail(f"no identity token: pass --token or set {TOKEN_ENV}", 2)
    server = conn.server
    # On a terminal, an attach waiting for the declared environment shows its build.
    options.setdefault("on_preparing", preparing_lines(conn.as_json))
    try:
        with SandboxClient(identity_token=conn.token, server_url=conn.server, **options) as client:
            server = client.server_url
            yield client, out
    except SandboxRequestError as exc:
        # A command that could not start exits as in a shell (127 not found, 126 unusable).
        fail(str(exc), shell_exit_code(exc) or 1)
    except SandboxUnavailableError as exc:
        # A refused connection is the newcomer's usual case: nothing listens there.
        hint = (
            f" (is the server running at {server}? start it with `podbay serve` or `podbay dev up`)"
            if isinstance(exc.cause, httpx.ConnectError)
            else ""
        )
        fail(f"unavailable: {exc.message}{hint}", 2)
    except ValueError as exc:  # configuration: bad token, bad URL
        # The SDK names its own parameter; here the option is --server.
        fail(str(exc).replace("pass server_url=", "pass --server URL"), 2)
    except OSError as exc:  # local files for cp
        fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 1)
    except KeyboardInterrupt:
        fail("interrupted", 130)
