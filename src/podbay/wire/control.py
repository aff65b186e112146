"""Control-plane models: sandboxes as a deployment sees them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from .limits import DEFAULT_SANDBOX_CLASS

#: ``lost``: split roles only; the node that holds it stopped answering.
SandboxStateName = Literal["creating", "running", "suspended", "stopped", "lost"]
#: How an attach got its running sandbox: tells an integration whether
#: once-per-machine setup must run.
StartKind = Literal["created", "resumed", "reused", "carried_over"]


# Every model below is a frozen keyword-only dataclass of a few fields, one per
# message: alike in shape to each other (and to the other model modules) on
# purpose, since each declares its own message of the contract.
@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    """A sandbox's egress policy: attach's ``network``, the body and answer of
    ``GET``/``PUT /api/v1/sandboxes/{name}/network`` (docs/network.md).
    ``{}`` is open; ``{"internet": false}`` no egress at all; ``allow`` and
    ``deny`` list CIDRs, domain names and ``*.`` wildcards (deny wins; an
    allow list refuses everything it does not name)."""

    internet: bool = True
    allow: list[str] | None = None
    deny: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class EgressDestination:
    """One destination of a sandbox's egress audit (docs/network.md, "Audit")."""

    #: IPv4 address (no IPv6 leaves a sandbox).
    address: str
    #: Destination port; 0 for a protocol without ports (ICMP).
    port: int
    #: ``tcp``, ``udp``, ``icmp``, or the protocol's number.
    protocol: str
    #: The name podbay's resolver last answered with this address; absent when
    #: none did (a policy without domain names has no resolver; gVisor's
    #: lookups never meet it).
    name: str | None = None
    verdict: Literal["reached", "refused"]
    #: Packets and bytes the sandbox sent there (outbound only).
    packets: int
    bytes: int
    #: The last packet to this destination, whichever verdict (to the second).
    last_seen: datetime


@dataclass(frozen=True, kw_only=True)
class EgressAudit:
    """``GET /api/v1/sandboxes/{name}/egress``: where the sandbox sent lately,
    busiest first; empty while it does not run."""

    destinations: list[EgressDestination] = field(default_factory=list)
    #: As many destinations as the audit holds (4096 at a hook): newer ones
    #: may be missing until older ones expire (an hour after their last packet).
    full: bool = False


@dataclass(frozen=True, kw_only=True)
class VolumeMount:
    """One mount of attach's ``volumes`` in its long form (docs/volumes.md):
    the volume's name, and ``read_only`` to refuse the sandbox's writes. The
    short form is the name alone (read-write)."""

    name: str
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class VolumeCreate:
    """Body of ``POST /api/v1/volumes``: a volume named ``name`` holding at most
    ``size_bytes`` or ``size_mib`` (one of them; a hard limit: writes past it
    fail with ENOSPC inside the sandbox)."""

    name: str
    size_bytes: int | None = None
    size_mib: int | None = None


@dataclass(frozen=True, kw_only=True)
class Volume:
    """A named persistent volume of the deployment (``GET``, ``list``, create's 201)."""

    name: str
    #: Its hard size limit, in bytes (the filesystem's size).
    size_bytes: int
    #: Bytes its files take now (the filesystem's own count).
    used_bytes: int
    created_at: datetime
    #: Names of the deployment's sandboxes that mount it (delete is refused
    #: while any does).
    mounted_by: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class VolumeList:
    volumes: list[Volume] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class VolumeEntry:
    """One entry of a volume directory's listing (files API, ``GET ...?path=dir``)."""

    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int


@dataclass(frozen=True, kw_only=True)
class VolumeEntryList:
    entries: list[VolumeEntry] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class AttachRequest:
    """Body of ``PUT /api/v1/sandboxes/{name}`` (optional)."""

    class_: str = field(default=DEFAULT_SANDBOX_CLASS, metadata={"wire": "class"})
    # Options of a new sandbox, each within the server's bounds; absent: the
    # server's setting. An existing sandbox keeps its own (docs/client.md).
    #: The owner's string key/values, matched by ``GET ...?label=k=v``.
    labels: dict[str, str] | None = None
    #: Set for every command of the sandbox; a call's own ``env`` wins.
    env: dict[str, str] | None = None
    cpus: float | None = None
    memory_mib: int | None = None
    #: Suspend after this long without a call, instead of the server's threshold.
    idle_timeout_seconds: int | None = None
    #: Its egress policy, instead of the sandbox section's ``network`` (then open).
    network: NetworkPolicy | None = None
    #: The deployment's volumes to mount, by absolute path in the sandbox:
    #: ``{"/data": "name"}`` or ``{"/data": {"name": "n", "read_only": true}}``.
    volumes: dict[str, str | VolumeMount] | None = None


@dataclass(frozen=True, kw_only=True)
class SandboxRecord:
    """A sandbox without credentials (``GET``, ``list``)."""

    name: str
    #: The caller's word (``default`` when none was given), as the reference
    #: contract has it; the class that runs is ``runtime_class``.
    class_: str = field(metadata={"wire": "class"})
    state: SandboxStateName
    created_at: datetime
    last_active_at: datetime
    ceiling_at: datetime | None = None  # absent while nothing runs
    #: The class the sandbox runs in (``gvisor``, ``container``, ``vm``); absent
    #: from servers that predate it (their ``class`` said it).
    runtime_class: str | None = None
    # What attach set at creation; each absent when unset (the server's setting).
    labels: dict[str, str] | None = None
    env: dict[str, str] | None = None
    cpus: float | None = None
    memory_mib: int | None = None
    idle_timeout_seconds: int | None = None
    #: The volumes it mounts, by path (absent: none).
    volumes: dict[str, VolumeMount] | None = None


@dataclass(frozen=True, kw_only=True)
class SandboxHandle(SandboxRecord):
    """A running sandbox and how to reach it (attach's 200)."""

    endpoint: str
    #: Opaque credentials: kept out of ``repr`` so they do not end up in logs.
    headers: dict[str, str] = field(repr=False)
    expires_at: datetime
    start: StartKind | None = None


@dataclass(frozen=True, kw_only=True)
class BuildStep:
    """Where the build of a declared environment stands: step ``step`` of
    ``steps`` (1-based) runs, doing ``doing``; ``elapsed_seconds`` since the
    build began. (Beyond the contract; an old client ignores it.)"""

    step: int
    steps: int
    doing: str
    elapsed_seconds: float


@dataclass(frozen=True, kw_only=True)
class Preparing:
    """Attach's 202 body while the declared environment is being prepared;
    ``progress`` once a build of it has begun here."""

    name: str
    state: Literal["creating"] = "creating"
    progress: BuildStep | None = None


@dataclass(frozen=True, kw_only=True)
class SandboxList:
    sandboxes: list[SandboxRecord] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ErrorBody:
    error: str
    code: str


@dataclass(frozen=True, kw_only=True)
class ForkRequest:
    """Body of ``POST /api/v1/sandboxes/{name}/fork`` (docs/fork.md): one new
    sandbox (``name``) or several (``names``, at most 16), each a copy of it."""

    name: str | None = None
    names: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class ForkResult:
    """The fork's 200: each new sandbox, running, in the order asked."""

    sandboxes: list[SandboxHandle]
    #: How long a running source was held still while its disk was copied
    #: (0 for a suspended or stopped one, which runs nothing).
    paused_ms: float
    #: Whether the copies run the source's processes (false: they start with
    #: its files and fresh processes; memory follows once checkpoints land).
    processes: bool = False


@dataclass(frozen=True, kw_only=True)
class ShareRequest:
    """``POST /api/v1/sandboxes/{name}/ports/{port}/share``."""

    expires_in_seconds: int = 3600


@dataclass(frozen=True, kw_only=True)
class ShareUrl:
    url: str
    expires_at: datetime
