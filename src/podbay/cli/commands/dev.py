"""``podbay dev``: real local sandboxes for an agent under development.

``podbay dev up`` starts (or reuses) a local ``podbay serve``, registers the
project's deployment from ./astropods.yml (or ``--spec``), and prints the
line to paste::

    eval "$(podbay dev up)"      # export ASTRO_AUTHZ_TOKEN=...

A changed astropods.yml applies on the next ``dev up``: the deployment is
updated, and each sandbox made under the old declaration is made anew under
the new one with its /workspace kept (as a carry-over keeps files; the
declared software is installed anew, and where the new setup wrote a file
the old /workspace also has, the old one is kept). ``podbay dev down``
deletes every sandbox of the project's deployment; the server keeps running
for other projects, unless ``--server``: then the server ``dev up`` started
is stopped too (its pid is kept in ``dev-serve.pid`` in the data directory).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx

from podbay.cli import options, serverpid
from podbay.cli.output import Output, fail
from podbay.wire import paths

#: How long ``dev up`` waits for a new server to answer /healthz (the first
#: start builds the base image).
READY_TIMEOUT_S = 900.0
#: How long ``dev down --server`` waits for the server to end after SIGTERM
#: (it suspends its running sandboxes first).
STOP_TIMEOUT_S = 120.0


def _project_name(spec_text: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    import yaml

    try:
        document = yaml.safe_load(spec_text) or {}
    except yaml.YAMLError:
        document = {}
    name = document.get("name") if isinstance(document, dict) else None
    if not isinstance(name, str) or not name:
        name = Path.cwd().name
    # Deployment names follow sandbox names' rules.
    cleaned = re.sub(r"[^A-Za-z0-9._:-]", "-", name).lstrip("._:-")[:128]
    return cleaned or "dev"


def _health(base_url: str) -> int | None:
    """/healthz status, or ``None`` when nothing answers."""
    try:
        return httpx.get(f"{base_url}/healthz", timeout=2.0).status_code
    except httpx.HTTPError:
        return None


def _start_server(settings: Any, out: Output) -> None:
    log = settings.data_dir / "dev-serve.log"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    out.info(f"podbay: starting podbay serve in the background (log: {log})")
    from podbay.cli.commands.serve import serve_argv

    with open(log, "ab") as sink:
        server = subprocess.Popen(
            serve_argv(settings.data_dir, f"{settings.server.host}:{settings.server.port}"),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    serverpid.record(settings.data_dir, server.pid)


def _wait_ready(base_url: str, out: Output, timeout_s: float, log: Path | None = None) -> None:
    """Wait for the server's health; on a terminal, the base-image build it runs
    meanwhile is drawn as a bar (from its log)."""
    from podbay.cli.progress import BuildProgress, follow_log

    bar = (
        BuildProgress(sys.stderr)
        if log is not None and not out.as_json and sys.stderr.isatty()
        else None
    )
    offset = log.stat().st_size if bar is not None and log is not None and log.exists() else 0
    deadline = time.monotonic() + timeout_s
    said = 0.0
    try:
        while time.monotonic() < deadline:
            if _health(base_url) == 200:
                return
            if bar is not None and log is not None:
                offset = follow_log(log, offset, bar)
            elif time.monotonic() - said > 15:
                out.info(
                    "podbay: waiting for the server to be ready "
                    "(the first start builds the sandbox base image)..."
                )
                said = time.monotonic()
            time.sleep(0.5)
    finally:
        if bar is not None:
            bar.close_bar()
    fail(f"podbay serve at {base_url} was not ready after {timeout_s:.0f} s")


def _sandbox_names(base_url: str, token: str) -> list[str]:
    response = httpx.get(
        f"{base_url}{paths.SANDBOXES}", headers={"authorization": f"Bearer {token}"}, timeout=30
    )
    if response.status_code != 200:
        fail(f"listing sandboxes failed: {response.status_code} {response.text.strip()}")
    return [row["name"] for row in response.json().get("sandboxes", [])]


#: Unpacks a sandbox's saved /workspace (a tar, $1) as root (owners, modes and
#: links as they were) over the new /workspace, so a file both have is the kept one.
_UNPACK = 'tar -xpf "$1" -C /workspace; s=$?; rm -f -- "$1"; exit $s'


def _renew(base_url: str, token: str, saves: Path, out: Output) -> tuple[int, int]:
    """Each sandbox made anew under the changed declaration, its /workspace kept:
    what the ceiling's carry-over does, with the declared software installed
    anew. (renewed, left as they were): one whose /workspace cannot be
    saved is left untouched under the old declaration, and said so. The
    saved /workspace waits in ``saves`` until it is back in the sandbox (and
    stays there, named, if that fails)."""
    from podbay.client import SandboxClient, _files
    from podbay.errors import PodbayError

    renewed = kept = 0
    saves.mkdir(parents=True, exist_ok=True)
    with SandboxClient(
        identity_token=token, server_url=base_url, prepare_timeout_seconds=READY_TIMEOUT_S
    ) as client:
        for record in client.list():
            name, saved = record.name, saves / f"{record.name}.tar"
            # In the sandbox's /tmp, outside what it packs; gone with the old sandbox.
            remote = _files.remote_temp("dev-workspace")
            try:
                packed = client.exec(name, _files.tar_command("/workspace", remote))
                if packed.exit_code != 0:
                    raise PodbayError(packed.stderr.strip() or f"tar exited {packed.exit_code}")
                client.download(name, remote, saved)
            except PodbayError as exc:
                out.info(f"podbay: sandbox {name} kept under the old declaration: {exc}")
                kept += 1
                continue
            client.delete(name)
            try:
                client.attach(name, record.class_)
                client.upload(name, saved, remote)
                unpacked = client.exec(name, ["/bin/sh", "-c", _UNPACK, "sh", remote])
                if unpacked.exit_code != 0:
                    raise PodbayError(unpacked.stderr.strip() or f"tar exited {unpacked.exit_code}")
            except PodbayError as exc:
                fail(f"making sandbox {name} anew failed: {exc}; its /workspace is in {saved}")
            saved.unlink()
            out.info(f"podbay: sandbox {name} made anew with the new declaration, /workspace kept")
            renewed += 1
    return renewed, kept


def _delete_all(base_url: str, token: str) -> int:
    names = _sandbox_names(base_url, token)
    for name in names:
        response = httpx.delete(
            f"{base_url}{paths.sandbox_path(name)}",
            headers={"authorization": f"Bearer {token}"},
            timeout=120,
        )
        if response.status_code not in (204, 404):
            fail(f"deleting sandbox {name} failed: {response.status_code} {response.text.strip()}")
    return len(names)


def _settings(data_dir: Path | None, listen: str | None) -> Any:
    from podbay.cli.commands.serve import parse_listen
    from podbay.settings import Settings

    host, port = parse_listen(listen)
    return Settings.load(data_dir=data_dir, server__host=host, server__port=port)


# click options as values, alike in shape to sandbox.py's by nature: each
# command module declares the options only it has.
spec_option = click.option(
    "--spec",
    default="astropods.yml",
    show_default=True,
    metavar="FILE",
    help="The project's astropods.yml.",
)
name_option = click.option(
    "--name", default=None, help="Deployment name (default: the spec's name, else the folder)."
)
data_dir_option = options.data_dir_option("The local server's data directory.")
listen_option = click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="Where the local server listens (default 127.0.0.1:8700).",
)


@click.group()
def command() -> None:
    """Local development: real sandboxes for your agent."""


@command.command()
@spec_option
@name_option
@data_dir_option
@listen_option
@options.json_option()
def up(
    spec: str, name: str | None, data_dir: Path | None, listen: str | None, as_json: bool
) -> None:
    """Start or reuse a local server, register this project, print the token export."""
    from podbay.cli.commands.deployment import read_spec, with_service

    out = Output(as_json=as_json)
    if not Path(spec).is_file():
        fail(f"no {spec} here; pass --spec FILE")
    text = read_spec(spec)
    settings = _settings(data_dir, listen)
    base_url = settings.server.base_url()
    project = _project_name(text, name)

    async def register(service: Any) -> tuple[str, bool, bool]:
        from podbay.control.services.deployments import DeploymentError

        try:
            existing = await service.get(project)
        except DeploymentError:
            _, token = await service.create(project, text)
            return token, True, False
        changed = existing.spec_text != text
        if changed:
            await service.update(project, text)
        return service.token_for(existing), False, changed

    # Register first: a spec with a bad sandbox section fails before any server starts.
    token, created, changed = with_service(settings.data_dir, register, issuer=base_url)
    status = _health(base_url)
    if status is None:
        _start_server(settings, out)
    _wait_ready(base_url, out, READY_TIMEOUT_S, settings.data_dir / "dev-serve.log")
    if created:
        out.info(f"podbay: registered deployment {project}")
    elif changed:
        out.info(f"podbay: {spec} changed: updated {project}")
        renewed, kept = _renew(base_url, token, settings.data_dir / "dev-workspaces", out)
        out.info(f"podbay: {renewed} sandbox(es) made anew, {kept} left as they were")
    else:
        out.info(f"podbay: reusing deployment {project}")
    out.value(
        {"deployment": project, "server": base_url, "token": token},
        f"export ASTRO_AUTHZ_TOKEN={token}",
    )


@command.command()
@spec_option
@name_option
@data_dir_option
@listen_option
@click.option(
    "--server",
    "stop_server",
    is_flag=True,
    help="Then stop the server `dev up` started (by its pid file in the data directory).",
)
def down(
    spec: str, name: str | None, data_dir: Path | None, listen: str | None, stop_server: bool
) -> None:
    """Delete every sandbox this project's deployment made (and, with --server, stop the server)."""
    from podbay.cli.commands.deployment import with_service

    out = Output()
    text = Path(spec).read_text() if Path(spec).is_file() else ""
    settings = _settings(data_dir, listen)
    base_url = settings.server.base_url()
    project = _project_name(text, name)
    token = with_service(settings.data_dir, lambda service: service.token(project))
    if _health(base_url) is not None:
        out.info(f"podbay: deleted {_delete_all(base_url, token)} sandbox(es) of {project}")
    elif not stop_server:
        fail(f"no podbay serve answers at {base_url}; nothing to delete")
    if stop_server:
        _stop_server(settings.data_dir, out)


def _stop_server(data_dir: Path, out: Output) -> None:
    try:
        pid = serverpid.stop(data_dir, STOP_TIMEOUT_S)
    except TimeoutError as exc:
        fail(str(exc))
    if pid is None:
        fail(
            f"no server started by `podbay dev up` runs on {data_dir} "
            f"(no live process in {serverpid.pid_file(data_dir)})"
        )
    out.info(f"podbay: stopped podbay serve (pid {pid})")
