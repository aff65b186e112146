"""Numbers the contract fixes: output caps, process counts, deadlines, names.

Every piece (agent, gateway, control plane, client) imports these; none
restates them. Lifecycle thresholds are operator settings, not contract, and
live in :mod:`podbay.settings`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name
if TYPE_CHECKING:
    from typing import Final

MIB: Final = 1024 * 1024

#: ``exec`` buffers at most this many bytes per stream, then sets ``truncated``.
EXEC_OUTPUT_CAP: Final = 1 * MIB
#: The largest per-stream cap an exec may ask for (``max_output_bytes``).
EXEC_OUTPUT_MAX: Final = 16 * MIB
#: Longest a poll may wait for news (``wait_ms``): under every client's timeout.
POLL_WAIT_MAX_MS: Final = 20_000
#: A spawned process keeps the newest this-many bytes per stream.
PROCESS_OUTPUT_RETAINED: Final = 1 * MIB
#: Tracked processes per sandbox (running, or exited and not yet killed).
MAX_PROCESSES: Final = 64
#: ``exec`` deadline when the request names none.
EXEC_DEFAULT_TIMEOUT_MS: Final = 60_000
#: Longest deadline an ``exec`` may ask for (one day).
EXEC_MAX_TIMEOUT_MS: Final = 24 * 3600 * 1000
#: Commands run here unless ``cwd`` says otherwise.
WORKSPACE: Final = "/workspace"

#: Signal names a client may send; the agent maps them to the OS numbers.
SIGNAL_NAMES: Final = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2")
DEFAULT_SIGNAL: Final = "TERM"

#: Attach's ``class``: ``default`` (what the server resolves it to) or an
#: isolation level by name, strongest first. A record names the level used.
DEFAULT_SANDBOX_CLASS: Final = "default"
SANDBOX_CLASS_NAMES: Final = ("vm", "gvisor", "container")
SANDBOX_CLASSES: Final = (DEFAULT_SANDBOX_CLASS, *SANDBOX_CLASS_NAMES)

#: Sandboxes one deployment may hold unless the operator says otherwise.
DEFAULT_DEPLOYMENT_SANDBOX_CAP: Final = 20
#: How long a data-plane credential lasts.
CREDENTIAL_TTL_SECONDS: Final = 15 * 60
#: ``Retry-After`` a client assumes when a 202 carries none.
DEFAULT_RETRY_AFTER_SECONDS: Final = 5

#: Largest JSON request body on the data plane (an argv near the kernel's
#: limit fits); larger is 413 ``REQUEST_TOO_LARGE``. File bodies (native
#: writes) stream with no cap but the sandbox's disk.
MAX_JSON_BODY: Final = 8 * MIB
#: Largest request body the control plane reads (attach's is a few bytes).
MAX_CONTROL_BODY: Final = 64 * 1024

#: The reference client writes binary files through ``exec`` in chunks this big
#: (base64 of 48 KiB stays far below Linux's 128 KiB per-argument limit).
BASE64_WRITE_CHUNK: Final = 48 * 1024

#: New sandboxes one fork call makes at most (each copies the source's disk
#: while it is held still, so the pause grows with the count).
MAX_FORK_COPIES: Final = 16

#: Sandbox names: what the reference accepts, nothing more.
#: A volume's name: a path component on the host (docs/volumes.md).
VOLUME_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,62}$"
SANDBOX_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_REST = _NAME_FIRST | frozenset("._:-")


def is_valid_sandbox_name(name: str) -> bool:
    """True when ``name`` is a sandbox name the contract accepts.

    >>> is_valid_sandbox_name("thread-42"), is_valid_sandbox_name("../x")
    (True, False)
    """
    # SANDBOX_NAME_PATTERN spelled out, because ``re`` (with the enum, functools
    # and collections it loads) costs the CLI's quick path a few ms to import;
    # tests/unit/wire/test_limits.py pins that the two agree.
    return (
        0 < len(name) <= 128 and name[0] in _NAME_FIRST and all(char in _NAME_REST for char in name)
    )
