"""URL paths and header names of the contract."""

from __future__ import annotations

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name
if TYPE_CHECKING:
    from typing import Final

# -- control plane (base URL = the identity token's ``iss``) -----------------
API_PREFIX: Final = "/api/v1"
SANDBOXES: Final = f"{API_PREFIX}/sandboxes"
#: The operator's API (docs/console.md): an operator token, never an identity token.
DEPLOYMENTS: Final = f"{API_PREFIX}/deployments"
NODES: Final = f"{API_PREFIX}/nodes"
#: A deployment's named persistent volumes (docs/volumes.md).
VOLUMES: Final = f"{API_PREFIX}/volumes"


def sandbox_path(name: str) -> str:
    """``/api/v1/sandboxes/{name}`` with the name escaped for a path segment."""
    from urllib.parse import quote  # here: the CLI's quick exec needs only the constants

    return f"{SANDBOXES}/{quote(name, safe='')}"


def sandbox_stop_path(name: str) -> str:
    return f"{sandbox_path(name)}/stop"


def sandbox_network_path(name: str) -> str:
    return f"{sandbox_path(name)}/network"


def sandbox_fork_path(name: str) -> str:
    """``POST``: copy the sandbox into new ones (:class:`~.control.ForkRequest`)."""
    return f"{sandbox_path(name)}/fork"


def sandbox_egress_path(name: str) -> str:
    return f"{sandbox_path(name)}/egress"


def volume_path(name: str) -> str:
    """``/api/v1/volumes/{name}`` with the name escaped for a path segment."""
    from urllib.parse import quote

    return f"{VOLUMES}/{quote(name, safe='')}"


def volume_files_path(name: str) -> str:
    """A volume's files without a sandbox (``?path=``)."""
    return f"{volume_path(name)}/files"


def volume_entries_path(name: str) -> str:
    """A volume directory's entries without a sandbox (``?path=``)."""
    return f"{volume_path(name)}/entries"


# -- data plane (base URL = the handle's ``endpoint``) ------------------------
INFO: Final = "/v1/info"
#: The host's own call (``vm`` figures the host cannot read): not a client route.
STATS: Final = "/v1/stats"
#: The host's own call: the command log (docs/observability.md).
COMMANDS: Final = "/v1/commands"
#: The host's own call before a checkpoint (podbay.agent.park): not a client route.
PARK: Final = "/v1/park"
EXEC: Final = "/v1/exec"
PROCESSES: Final = "/v1/processes"
FILES: Final = "/v1/files"  # GET read, PUT write, DELETE remove; ?path=
FILES_STAT: Final = "/v1/files/stat"  # GET ?path=
FILES_LIST: Final = "/v1/files/list"  # GET ?path=
FILES_MKDIR: Final = "/v1/files/mkdir"  # POST MakeDirRequest
FILES_CHMOD: Final = "/v1/files/chmod"  # POST ChmodRequest
FILES_MOVE: Final = "/v1/files/move"  # POST MoveRequest


def process_path(process_id: str) -> str:
    from urllib.parse import quote

    return f"{PROCESSES}/{quote(process_id, safe='')}"


def process_signal_path(process_id: str) -> str:
    return f"{process_path(process_id)}/signal"


def process_stdin_path(process_id: str) -> str:
    """``POST`` raw bytes to a process spawned with ``stdin: true``; ``?close=true``
    closes its stdin after them."""
    return f"{process_path(process_id)}/stdin"


# -- headers ----------------------------------------------------------------
#: Hex SHA-256 of a file's bytes: sent by a writer (PUT), returned to a reader (GET).
DIGEST_HEADER: Final = "X-Podbay-Sha256"
#: ``DIGEST_HEADER``'s value on a write whose digest FOLLOWS the content: the
#: body's last 64 bytes are the hex SHA-256 of the bytes before them, so a
#: writer hashes in the same pass it sends (agents advertising
#: ``FEATURE_TRAILING_DIGEST`` take it).
DIGEST_TRAILING: Final = "trailing"
#: Length of a hex SHA-256.
DIGEST_HEX_LENGTH: Final = 64
#: Octal permission bits for a written file (PUT), e.g. ``0755``.
MODE_HEADER: Final = "X-Podbay-Mode"
#: The data-plane credential, as minted by the control plane and opaque to clients.
CREDENTIAL_HEADER: Final = "X-Podbay-Credential"
REQUEST_ID_HEADER: Final = "X-Request-Id"
#: Sent on attach by a client that handles 202 itself (RFC 7240): the control
#: plane then answers 202 at once instead of holding the request while the
#: environment builds (which it does for clients that predate 202).
PREFER_HEADER: Final = "Prefer"
PREFER_ASYNC: Final = "respond-async"
#: Set by the gateway (never by a client: it drops theirs) when the operator
#: made another account than root the default ``user`` of commands and files.
DEFAULT_USER_HEADER: Final = "X-Podbay-Default-User"

#: An exec body of this type is one line of ExecRequest JSON, then the
#: command's stdin, raw, to the end of the body (streamed, no size cap).
EXEC_STDIN_CONTENT_TYPE: Final = "application/vnd.podbay.exec-stdin"
#: An exec sent with ``Accept:`` this gets its output as it is written: NDJSON
#: events (see ``podbay.wire.data.ExecEvent``), the last one ``{"result": …}``.
EXEC_STREAM_CONTENT_TYPE: Final = "application/x-ndjson"

#: Features an agent may advertise at ``/v1/info``.
FEATURE_FILES: Final = "files"
#: Writes may carry their digest after the content (``DIGEST_TRAILING``).
FEATURE_TRAILING_DIGEST: Final = "files.trailing-digest"
#: ``chmod`` and ``move`` in the native files API; ``stat`` with the owner.
FEATURE_FILES_OPS: Final = "files-ops"
#: exec's stdin body; spawn's ``stdin`` and ``POST /v1/processes/{id}/stdin``.
FEATURE_STDIN: Final = "stdin"
#: exec's ``output_encoding``, ``max_output_bytes``, ``keep``; poll's ``encoding``.
FEATURE_EXEC_OUTPUT: Final = "exec-output"
#: poll's ``wait_ms`` and the streamed exec answer.
FEATURE_LIVE_OUTPUT: Final = "live-output"
#: ``user`` on exec, spawn and file calls.
FEATURE_USERS: Final = "users"
#: Terminals: ``GET /v1/pty`` upgraded to a WebSocket (see :mod:`podbay.wire.stream`).
FEATURE_PTY: Final = "pty"
#: ``/v1/ports/{port}/...`` reaches a server listening inside the sandbox.
FEATURE_PORTS: Final = "ports"

# -- terminals and ports ------------------------------------------------------
#: A WebSocket: the client's first (text) message is a ``PtyRequest``; then
#: binary messages are terminal bytes both ways and text messages are JSON
#: control messages (``resize`` in, ``exit`` or ``error`` out).
PTY: Final = "/v1/pty"
#: ``/v1/ports/{port}/<path>``: HTTP and WebSocket requests relayed to
#: ``127.0.0.1:{port}`` inside the sandbox, with ``<path>`` as their path.
PORTS: Final = "/v1/ports"
#: Agent-side only (the gateway's leg): an HTTP/1.1 upgrade to a raw byte
#: stream to ``127.0.0.1:{port}`` inside the sandbox; ``?port=N``.
TUNNEL: Final = "/v1/tunnel"
#: The ``Upgrade`` tokens of the gateway-to-agent leg.
UPGRADE_PTY: Final = "podbay-pty"
UPGRADE_TUNNEL: Final = "podbay-tunnel"
#: Share URLs: ``<public URL>/share/<token>/<path>``, signed, scoped to one
#: sandbox and port, expiring; no credential header needed.
SHARE_PREFIX: Final = "/share/"
#: A sandbox's data plane: ``<gateway URL>/sandbox/<id>/...``.
SANDBOX_PREFIX: Final = "/sandbox/"


def sandbox_endpoint(base_url: str, sandbox_id: str) -> str:
    """A sandbox's absolute data-plane base URL behind the gateway at ``base_url``."""
    return f"{base_url.rstrip('/')}{SANDBOX_PREFIX}{sandbox_id}"


def port_share_path(name: str, port: int) -> str:
    """Control plane: ``POST`` mints a share URL for ``port`` of sandbox ``name``."""
    return f"{sandbox_path(name)}/ports/{port}/share"
