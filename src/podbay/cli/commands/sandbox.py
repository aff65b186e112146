"""``podbay sandbox ...``: use sandboxes from a shell, through the Python SDK.

    podbay sandbox exec thread-42 -- python3 -c 'print(2 + 2)'
    podbay sandbox cp ./src thread-42:/workspace/src
    podbay sandbox list --json

The token comes from ``--token`` or ``ASTRO_AUTHZ_TOKEN``; the server from
``--server`` or the token's ``iss``. ``--json`` prints one JSON document for
scripts. ``exec`` and ``run`` exit with the command's own exit code.
Failures are one line on stderr: exit 1 when the server refused
(``podbay: 404 SANDBOX_NOT_FOUND: ...``), 127 or 126 when the command could
not start (not found; not executable), as in a shell, 2 when the server could
not be reached or the invocation is wrong, 130 on Ctrl-C. Only the verbs
that use a sandbox (attach, exec, run, shell, cp into it) create one; the
others answer 404 for a name that does not exist.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from podbay.cli.completion import completing_names
from podbay.cli.output import Output, fail
from podbay.cli.quick_exec import local_stdin, print_exec_result

from .sandbox_group import Connection, _options, _session, command

if TYPE_CHECKING:
    from datetime import datetime

    from podbay.client import SandboxClient, VolumeMount
    from podbay.wire.control import SandboxHandle, SandboxRecord
    from podbay.wire.data import ProcessOutput

F = TypeVar("F", bound=Callable[..., Any])


def _existing(client: SandboxClient, name: str) -> None:
    """Refuse (404 ``SANDBOX_NOT_FOUND``, exit 1) a sandbox that does not exist.

    The SDK attaches on first use, which creates the sandbox: right for the
    verbs that mean "use this sandbox" (attach, exec, run, shell, cp into
    it), wrong for those that only look or stop something (ls, ps, kill, cp
    out of it), where a typo would otherwise make a sandbox of that name.
    The record is read first; only then does the SDK attach.
    """
    client.get(name)


def _handle_json(handle: SandboxHandle) -> dict[str, Any]:
    from podbay.wire.codec import encode

    data = encode(handle)
    data.pop("headers", None)  # credentials never leave the client
    return dict(data)


def _env(pairs: tuple[str, ...]) -> dict[str, str] | None:
    return _pairs(pairs, "--env")


def _pairs(pairs: tuple[str, ...], option: str) -> dict[str, str] | None:
    """``KEY=VALUE`` options as a mapping (None when there are none)."""
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"{option} wants KEY=VALUE, not {pair!r}", 2)
        found[key] = value
    return found or None


_volume_option = click.option(
    "--volume",
    "volumes",
    multiple=True,
    metavar="PATH=VOLUME[:ro]",
    help="Mount the deployment's VOLUME at PATH (repeatable; :ro read-only; docs/volumes.md).",
)


def _mounts(pairs: tuple[str, ...]) -> dict[str, str | VolumeMount] | None:
    """``--volume PATH=VOLUME[:ro]`` options as attach's ``volumes``."""
    from podbay.client import VolumeMount

    mounts: dict[str, str | VolumeMount] = {}
    for path, volume in (_pairs(pairs, "--volume") or {}).items():
        base = volume.removesuffix(":ro")
        mounts[path] = VolumeMount(name=base, read_only=True) if base != volume else base
    return mounts or None


# -- lifecycle ---------------------------------------------------------------------


@command.command()
@click.argument("name")
@click.option(
    "--class",
    "sandbox_class",
    default=None,
    help="Sandbox class: default, vm, gvisor or container.",
)
@_volume_option
@_options
def attach(
    name: str, sandbox_class: str | None, volumes: tuple[str, ...], conn: Connection
) -> None:
    """Create, resume or reuse sandbox NAME."""
    with _session(conn) as (client, out):
        handle = client.attach(name, sandbox_class, volumes=_mounts(volumes))
        out.value(_handle_json(handle), f"{handle.name}  {handle.state}  ({handle.start})")


@command.command()
@click.argument("name")
@_options
def get(name: str, conn: Connection) -> None:
    """Show sandbox NAME."""
    with _session(conn) as (client, out):
        record = client.get(name)
        shown = {**_row(record), **_options_shown(record)}
        out.value(record, "\n".join(f"{k}: {v}" for k, v in shown.items()))


@command.command()
@click.argument("name")
@click.option(
    "--internet/--no-internet",
    default=None,
    help="--no-internet: no egress at all. --internet alone: open (no lists).",
)
@click.option("--allow", multiple=True, metavar="CIDR|NAME", help="Allow only these (repeatable).")
@click.option("--deny", multiple=True, metavar="CIDR|NAME", help="Refuse these (repeatable).")
@_options
def network(
    name: str,
    internet: bool | None,
    allow: tuple[str, ...],
    deny: tuple[str, ...],
    conn: Connection,
) -> None:
    """Show sandbox NAME's egress policy, or set it (in force when this returns).

    CIDRs, domain names and *.wildcards; deny wins over allow, and an allow
    list refuses what it does not name (docs/network.md).
    """
    with _session(conn) as (client, out):
        if internet is None and not allow and not deny:
            policy = client.network(name)
        else:
            policy = client.set_network(
                name,
                internet=internet is not False,
                allow=list(allow) or None,
                deny=list(deny) or None,
            )
        if not policy.internet:
            text = "internet: no (no egress at all)"
        elif not policy.allow and not policy.deny:
            text = "open"
        else:
            lists = {"allow": policy.allow, "deny": policy.deny}
            text = "\n".join(f"{key}: {' '.join(v)}" for key, v in lists.items() if v)
        out.value(policy, text)


@command.command()
@click.argument("name")
@click.argument("new_names", nargs=-1, required=True)
@_options
def fork(name: str, new_names: tuple[str, ...], conn: Connection) -> None:
    """Copy sandbox NAME into new running sandboxes NEW_NAMES (at most 16):
    its files as they are now, its class, options and egress policy; each a
    sandbox of its own from then on (docs/fork.md). Processes are not copied."""
    with _session(conn) as (client, out):
        result = client.fork(name, *new_names)
        lines = [f"{h.name}  {h.state}" for h in result.sandboxes]
        lines.append(f"{name} paused {result.paused_ms:.0f} ms while its files were copied")
        shown = {
            "sandboxes": [_handle_json(h) for h in result.sandboxes],
            "paused_ms": result.paused_ms,
            "processes": result.processes,
        }
        out.value(shown, "\n".join(lines))


@command.command()
@click.argument("name")
@_options
def egress(name: str, conn: Connection) -> None:
    """Show where sandbox NAME sent lately: each destination it reached or was
    refused, busiest first (kept an hour after its last packet; none while it
    does not run; docs/network.md, "Audit")."""
    with _session(conn) as (client, out):
        audit = client.egress(name)
        rows = [
            [
                d.verdict,
                d.name or "-",
                d.address,
                d.port,
                d.protocol,
                d.packets,
                d.bytes,
                d.last_seen.strftime("%Y-%m-%d %H:%M:%S"),
            ]
            for d in audit.destinations
        ]
        out.table(
            rows,
            ["VERDICT", "NAME", "ADDRESS", "PORT", "PROTOCOL", "PACKETS", "BYTES", "LAST SEEN"],
            data=audit,
        )
        if audit.full and not out.as_json:
            out.info("the audit is full: newer destinations may be missing until older ones expire")


def _options_shown(record: SandboxRecord) -> dict[str, Any]:
    """The create-time options the record has, for ``get``'s text."""
    shown: dict[str, Any] = {}
    for key in ("labels", "env"):
        pairs = getattr(record, key)
        if pairs:
            shown[key] = " ".join(f"{k}={v}" for k, v in sorted(pairs.items()))
    for key in ("cpus", "memory_mib", "idle_timeout_seconds"):
        if getattr(record, key) is not None:
            shown[key] = getattr(record, key)
    return shown


@command.command("list")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only sandboxes with this label (repeatable: all of them).",
)
@_options
def list_(labels: tuple[str, ...], conn: Connection) -> None:
    """List this deployment's sandboxes."""
    wanted = _pairs(labels, "--label")
    with _session(conn) as (client, out):
        records = client.list(labels=wanted)
        rows = [list(_row(r).values()) for r in records]
        out.table(
            rows,
            ["NAME", "STATE", "CLASS", "RUNTIME CLASS", "CREATED", "LAST ACTIVE", "CEILING"],
            data=records,
        )


def _row(record: SandboxRecord) -> dict[str, Any]:
    def when(value: datetime | None) -> str:
        return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"

    return {
        "name": record.name,
        "state": record.state,
        "class": record.class_,
        "runtime_class": record.runtime_class or "-",
        "created": when(record.created_at),
        "last_active": when(record.last_active_at),
        "ceiling": when(record.ceiling_at),
    }


def _lifecycle(name: str, past: str, help: str, act: Callable[[SandboxClient, str], None]) -> None:
    """A subcommand ``podbay sandbox NAME SANDBOX`` that does ``act`` and says ``past``."""

    @command.command(name=name, help=help)
    @click.argument("sandbox_name", metavar="NAME")
    @_options
    def run(sandbox_name: str, conn: Connection) -> None:
        with _session(conn) as (client, out):
            act(client, sandbox_name)
            out.value({"name": sandbox_name, past: True}, f"{past} {sandbox_name}")


# "suspended": the state `get` and `list` then show.
_lifecycle(
    "stop",
    "suspended",
    "Suspend sandbox NAME now (the next use resumes it).",
    lambda c, n: c.stop(n),
)
_lifecycle("rm", "deleted", "Delete sandbox NAME and its files.", lambda c, n: c.delete(n))


# -- commands ------------------------------------------------------------------------


# exec, run and shell list their parameters alike on purpose: click hands each
# option to its function by name, and each command is read as a whole.
def _command_options(func: F) -> F:
    func = click.option(
        "--env",
        "env",
        multiple=True,
        metavar="KEY=VALUE",
        help="Environment variable (repeatable).",
    )(func)
    func = click.option("--cwd", default=None, help="Working directory (default /workspace).")(func)
    func = click.option("--timeout-ms", type=int, default=None, help="Deadline in ms.")(func)
    return func


@command.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@_command_options
@click.option("--user", default=None, help="Run as this account of the sandbox (default root).")
@click.option(
    "--no-stdin",
    is_flag=True,
    help="Do not pass this standard input (a pipe or file) to the command.",
)
@_options
def exec_(
    name: str,
    argv: tuple[str, ...],
    cwd: str | None,
    env: tuple[str, ...],
    timeout_ms: int | None,
    user: str | None,
    no_stdin: bool,
    conn: Connection,
) -> None:
    """Run ARGV in NAME (after --); print its output; exit with its exit code.

    A standard input that is not a terminal is passed to the command
    (`echo hi | podbay sandbox exec NAME -- cat` prints hi).
    """
    fd = None if no_stdin else local_stdin()
    stdin = open(fd, "rb", buffering=0, closefd=False) if fd is not None else None  # noqa: SIM115
    with _session(conn) as (client, out):
        result = client.exec(
            name, list(argv), cwd=cwd, env=_env(env), timeout_ms=timeout_ms, user=user, stdin=stdin
        )
        if out.as_json:
            out.value(result)
        else:
            print_exec_result(
                result.stdout, result.stderr, result.truncated, result.timed_out, out.out, out.err
            )
    sys.exit(result.exit_code)


@command.command(context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@_command_options
@click.option(
    "--interval-ms", type=int, default=200, show_default=True, help="How often to poll for output."
)
@_options
def run(
    name: str,
    argv: tuple[str, ...],
    cwd: str | None,
    env: tuple[str, ...],
    timeout_ms: int | None,
    interval_ms: int,
    conn: Connection,
) -> None:
    """Run ARGV in NAME with live output (no output cap); exit with its exit code."""
    with _session(conn) as (client, out):

        def show(chunk: ProcessOutput) -> None:
            if chunk.stdout:
                out.raw(chunk.stdout)
            if chunk.stderr:
                out.err.write(chunk.stderr)
                out.err.flush()
            lost = chunk.stdout_dropped + chunk.stderr_dropped
            if lost:
                out.info(f"podbay: {lost} bytes of output were lost (1 MiB retained)")

        result = client.run(
            name,
            list(argv),
            cwd=cwd,
            env=_env(env),
            interval_ms=interval_ms,
            timeout_ms=timeout_ms,
            on_output=None if out.as_json else show,
        )
        if out.as_json:
            out.value(result)
        elif result.killed:
            out.info(
                "podbay: the command was killed" + (" at its deadline" if result.timed_out else "")
            )
    sys.exit(result.exit_code if result.exit_code is not None else 1)


@command.command(context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--env", "env", multiple=True, metavar="KEY=VALUE", help="Environment variable (repeatable)."
)
@click.option("--cwd", default=None, help="Working directory (default /workspace).")
@click.option("--user", default=None, help="Account to run as (default: the sandbox's default).")
@_options
def shell(
    name: str,
    argv: tuple[str, ...],
    cwd: str | None,
    env: tuple[str, ...],
    user: str | None,
    conn: Connection,
) -> None:
    """Open a terminal in NAME running ARGV (after --; default: bash -l).

    Keys go through as typed (Ctrl-C reaches the program in the sandbox),
    the window's size follows the local one, and the exit code is the
    command's. With standard input not a terminal (a pipe, a file) there is
    no terminal in the sandbox either: the input is the command's, its
    output comes back as written, without prompts or echo.
    """
    from podbay.cli.terminal import DEFAULT_SHELL, drive, local_size, raw_mode

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if not os.isatty(stdin):
        _shell_without_terminal(name, list(argv) or DEFAULT_SHELL, cwd, _env(env), user, conn)
    rows, cols = local_size(stdin)
    term = os.environ.get("TERM") or "xterm-256color"
    command_env = _env(env)
    # Keyword arguments passed by like names: alike in shape to the client's own
    # calls (exec's body) by coincidence only.
    with (
        _session(conn) as (client, _),
        client.pty(
            name,
            list(argv) or DEFAULT_SHELL,
            rows=rows,
            cols=cols,
            term=term,
            cwd=cwd,
            env=command_env,
            user=user,
        ) as terminal,
        raw_mode(stdin),
    ):
        code = drive(terminal, stdin, stdout)
    sys.exit(code)


#: A piped ``shell`` runs until its input ends and its command exits, as
#: ``ssh host < script`` does: the exec deadline is a day (the contract's longest).
PIPED_SHELL_TIMEOUT_S = 86_400


def _shell_without_terminal(
    name: str,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    user: str | None,
    conn: Connection,
) -> None:
    """``shell`` with standard input a pipe or a file: a terminal in the sandbox
    would echo the input and draw prompts and bracketed-paste codes into the
    output, so the command runs without one (a shell then reads its commands
    from the input, as ``bash < script`` does); exits with its exit code."""
    fd = local_stdin()
    source = open(fd, "rb", buffering=0, closefd=False) if fd is not None else None  # noqa: SIM115
    code = 1
    with _session(conn, timeout_seconds=PIPED_SHELL_TIMEOUT_S) as (client, out):
        for event in client.stream(name, argv, cwd=cwd, env=env, user=user, stdin=source):
            result = event.result
            for text, sink in (
                (event.stdout or (result.stdout if result else ""), out.out),
                (event.stderr or (result.stderr if result else ""), out.err),
            ):
                if text:
                    sink.write(text)
                    sink.flush()
            if result is not None:
                code = result.exit_code
    sys.exit(code)


@command.command()
@click.argument("name")
@_options
def ps(name: str, conn: Connection) -> None:
    """List the processes of NAME."""
    with _session(conn) as (client, out):
        _existing(client, name)
        processes = client.processes(name)
        rows = [
            [p.process_id, p.state, "" if p.exit_code is None else p.exit_code, " ".join(p.command)]
            for p in processes
        ]
        out.table(rows, ["PROCESS_ID", "STATE", "EXIT", "COMMAND"], data=processes)


@command.command()
@click.argument("name")
@click.argument("process_id")
@click.option(
    "--signal",
    "signal_name",
    default=None,
    help="Send this signal (TERM, KILL, INT, ...) instead of killing and forgetting.",
)
@_options
def kill(
    name: str,
    process_id: str,
    signal_name: str | None,
    conn: Connection,
) -> None:
    """Kill PROCESS_ID in NAME and forget it (or only --signal it)."""
    with _session(conn) as (client, out):
        _existing(client, name)
        if signal_name:
            client.signal(name, process_id, signal_name.upper())
            out.value(
                {"process_id": process_id, "signal": signal_name.upper()},
                f"sent {signal_name.upper()} to {process_id}",
            )
        else:
            client.kill(name, process_id)
            out.value({"process_id": process_id, "killed": True}, f"killed {process_id}")


# -- files ------------------------------------------------------------------------------


@command.command()
@click.argument("name")
@click.argument("path", default=".")
@_options
def ls(name: str, path: str, conn: Connection) -> None:
    """List PATH (default: the workspace) in NAME; directories end with '/'."""
    with _session(conn) as (client, out):
        _existing(client, name)
        entries = client.list_dir(name, path)
        if out.as_json:
            out.value(entries)
        for entry in [] if out.as_json else entries:
            out.line(entry.name + ("/" if entry.is_directory else ""))


def split_remote(arg: str) -> tuple[str, str] | None:
    """``NAME:PATH`` → (name, path), or None for a local path.

    Sandbox names may contain ':', so an absolute PATH splits at ':/' and
    anything else at the last ':'. An existing local path is always local.

    >>> split_remote("slack:C1:17.2:/workspace/a"), split_remote("t42:out.txt")
    (('slack:C1:17.2', '/workspace/a'), ('t42', 'out.txt'))
    """
    if ":" not in arg or os.path.exists(arg) or arg.startswith(("/", "./", "../")):
        return None
    at = arg.find(":/")
    name, path = (arg[:at], arg[at + 1 :]) if at > 0 else arg.rsplit(":", 1)
    return (name, path or ".") if name else None


class _Bar:
    """A progress bar on stderr, drawn only for people (a terminal, no --json)."""

    def __init__(self, out: Output, label: str) -> None:
        self.out = out
        self.label = label
        self.enabled = not out.as_json and out.err.isatty()
        self.shown = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        size = f"{done / 1e6:.1f} MB"
        if total:
            filled = int(30 * done / total) if total else 30
            line = f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {size}"
        else:
            line = f"\r{self.label} {size}"
        self.out.err.write(line)
        self.out.err.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.out.err.write("\n")
            self.out.err.flush()


@command.command()
@click.argument("source")
@click.argument("destination")
@_options
def cp(source: str, destination: str, conn: Connection) -> None:
    """Copy a file or directory: LOCAL NAME:PATH uploads, NAME:PATH LOCAL downloads."""
    remote_src, remote_dst = split_remote(source), split_remote(destination)
    if bool(remote_src) == bool(remote_dst):
        fail("cp wants exactly one NAME:PATH side (e.g. cp ./app t42:/workspace/app)", 2)
    with _session(conn) as (client, out):
        bar = _Bar(out, os.path.basename(source.rstrip("/")) or source)
        try:
            if remote_dst:
                client.upload(remote_dst[0], source, remote_dst[1], progress=bar)
            else:
                assert remote_src is not None
                _existing(client, remote_src[0])
                client.download(remote_src[0], remote_src[1], destination, progress=bar)
        finally:
            bar.close()
        out.value(
            {"source": source, "destination": destination}, f"copied {source} -> {destination}"
        )


# -- create, ports ----------------------------------------------------------------------


@command.command()
@click.argument("name")
@click.option(
    "--class",
    "sandbox_class",
    default=None,
    help="Sandbox class: default, vm, gvisor or container.",
)
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Label (repeatable).")
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    help="Variable for every command of the sandbox (repeatable).",
)
@click.option("--cpus", type=float, default=None, help="CPUs (within the server's bounds).")
@click.option("--memory", type=int, default=None, metavar="MIB", help="Memory in MiB.")
@click.option(
    "--idle-timeout",
    type=int,
    default=None,
    metavar="S",
    help="Suspend after S seconds without a call (instead of the server's threshold).",
)
@_volume_option
@_options
def create(
    name: str,
    sandbox_class: str | None,
    labels: tuple[str, ...],
    env: tuple[str, ...],
    cpus: float | None,
    memory: int | None,
    idle_timeout: int | None,
    volumes: tuple[str, ...],
    conn: Connection,
) -> None:
    """Create sandbox NAME with these options (an existing one with other
    options is refused; options apply at creation)."""
    with _session(conn) as (client, out):
        handle = client.attach(
            name,
            sandbox_class,
            labels=_pairs(labels, "--label"),
            env=_env(env),
            cpus=cpus,
            memory_mib=memory,
            idle_timeout_seconds=idle_timeout,
            volumes=_mounts(volumes),
        )
        out.value(_handle_json(handle), f"{handle.name}  {handle.state}  ({handle.start})")


@command.command()
@click.argument("name")
@_options
def ports(name: str, conn: Connection) -> None:
    """List the TCP ports a server in NAME listens on."""
    with _session(conn) as (client, out):
        _existing(client, name)
        found = client.listening_ports(name)
        if out.as_json:
            out.value({"ports": found})
        for port in [] if out.as_json else found:
            out.line(str(port))


@command.command()
@click.argument("name")
@click.argument("port", type=click.IntRange(1, 65535))
@click.argument("path", default="/")
@click.option(
    "--share",
    "share_seconds",
    type=int,
    default=None,
    metavar="S",
    help="A signed URL a person can open without credentials, valid S seconds.",
)
@_options
def url(name: str, port: int, path: str, share_seconds: int | None, conn: Connection) -> None:
    """The URL of PORT in NAME through the gateway (it needs the sandbox's
    credential; --share makes one that does not)."""
    with _session(conn) as (client, out):
        _existing(client, name)
        if share_seconds is not None:
            link = client.share_url(name, port, expires_in_seconds=share_seconds)
        else:
            link = client.url(name, port, path)
        out.value({"url": link}, link)


# ``top`` and ``logs`` live in their own module, which adds them to ``command``
# (before the names are given their completion).
from . import observe as _observe  # noqa: E402, F401

completing_names(command)

__all__ = ["command", "split_remote"]
