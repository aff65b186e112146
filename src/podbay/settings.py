"""One typed settings tree, built once in ``main()`` and passed down.

Nothing reads the environment at import. :meth:`Settings.load` starts from
the defaults, applies ``PODBAY_<SECTION>_<FIELD>`` environment variables
(``PODBAY_LIFECYCLE_IDLE_SECONDS=30``), then the command line's flags.

>>> s = Settings.load(environ={"PODBAY_CAPS_PER_DEPLOYMENT": "5"})
>>> s.caps.per_deployment
5
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .wire.limits import CREDENTIAL_TTL_SECONDS, DEFAULT_DEPLOYMENT_SANDBOX_CAP

GIB = 1024**3


def default_data_dir() -> Path:
    """``/var/lib/podbay`` as root, ``~/.local/share/podbay`` otherwise."""
    if os.geteuid() == 0:
        return Path("/var/lib/podbay")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "podbay"


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8700
    #: Base URL clients use: the identity token's ``iss`` and the endpoint prefix.
    #: Empty means ``http://{host}:{port}``.
    public_url: str = ""
    #: A request head must arrive whole within this (else 408, connection closed).
    head_timeout_seconds: float = 10.0
    #: A request body may pause at most this long between bytes.
    body_timeout_seconds: float = 60.0
    #: Client connections held at once; lowered at start to leave descriptors
    #: for the rest of the server (see ``podbay.control.listener``).
    max_connections: int = 4096
    #: While a declared environment builds, attach holds the request up to this
    #: long for the build to finish (then 200) before answering 202: under the
    #: 30 s timeout of the reference client, which predates 202.
    attach_hold_seconds: float = 20.0
    #: Requests of one sandbox the gateway has at its agent at once; those whose
    #: body streams from the client take at most half (see ``gateway.admission``).
    sandbox_requests: int = 64
    #: Requests of one sandbox that wait for one of those; one more: 429 SANDBOX_BUSY.
    sandbox_queue: int = 256
    #: WebSockets to one sandbox's ports open at once (they hold no request
    #: slot); one more: 429 SANDBOX_BUSY (see ``dataplane.admission``).
    sandbox_websockets: int = 32
    #: A WebSocket to a port with no message either way for this long is
    #: closed (1001) on both sides; pings do not count.
    port_websocket_idle_seconds: float = 600.0
    #: Longest wait for an agent to start answering a call (after an exec's own
    #: timeout, for an exec): then 504 AGENT_TIMEOUT and the machine is checked.
    agent_answer_seconds: float = 30.0
    #: E2B's ``get_host(port)`` is ``{port}-{sandboxID}.{e2b_domain}`` (a name
    #: whose subdomains reach this server, or in a cluster the nodes). Empty:
    #: the address each create was sent to (a loopback one as ``localhost:PORT``).
    e2b_domain: str = ""

    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


@dataclass
class RuntimeSettings:
    #: Sandbox classes this server runs, in order of preference: any of ``vm``,
    #: ``gvisor``, ``container`` (see docs/runtime.md). ``vm`` only when listed.
    classes: str = "gvisor,container"
    #: What attach's ``default`` class means; empty: the first enabled class that
    #: works at useful speed on this host (``podbay doctor`` prints it).
    default_class: str = ""
    #: OCI runtime binary of the ``container`` class: runc (default) or crun.
    oci_runtime: str = "runc"
    #: OCI runtime binary of the ``gvisor`` class.
    gvisor_runtime: str = "runsc"
    #: How ``vm`` guests run: ``tcg`` (emulated, works everywhere, slow) or ``kvm``
    #: (set it only where ``podbay doctor`` shows a KVM guest boots).
    vm_accel: str = "tcg"
    #: gVisor platform (the ``gvisor`` class): ptrace, systrap or kvm; empty picks
    #: the best this runsc and host run (kvm only if a sandbox starts on it).
    runsc_platform: str = ""
    memory_bytes: int = 1 * GIB
    cpus: float = 1.0
    #: Bounds of what attach may ask for one sandbox (``memory_mib``, ``cpus``);
    #: outside them attach is 400 ``SANDBOX_MEMORY_BELOW_MIN`` and the like.
    min_memory_bytes: int = 256 * 1024**2
    max_memory_bytes: int = 4 * GIB
    min_cpus: float = 0.25
    max_cpus: float = 4.0
    pids: int = 256
    disk_bytes: int = 10 * GIB
    #: New sandboxes are refused (507 HOST_DISK_FULL) while the data directory's
    #: filesystem has less free than this: sparse disks grow as sandboxes write,
    #: and 0 turns the check off.
    disk_reserve_bytes: int = 5 * GIB
    #: First host uid/gid that sandbox uid 0 maps to; 65536 ids from there.
    uid_base: int = 1_000_000
    #: Outbound internet through slirp4netns; off gives a loopback-only sandbox.
    network: bool = True
    #: Descriptors one sandbox's network helper (slirp4netns, a host process) may
    #: hold, its RLIMIT_NOFILE: every connection the sandbox has open is one, so
    #: this caps them (docs/network.md). 64 to 1048576.
    slirp_max_fds: int = 4096
    #: Each sandbox's outgoing bandwidth in Mbit/s, all its connections together
    #: (a token bucket on its network device, docs/network.md "Budgets"), so
    #: one sandbox cannot fill the host's link. 0: no cap; else 1 to 100000.
    egress_bandwidth_mbit: int = 0
    #: New outgoing connections (TCP, UDP flows) one sandbox may open per
    #: second (a burst of a tenth of that, at least 5, on top); the ones over it
    #: are refused, so one sandbox cannot fill the host's connection tracking
    #: or its network helper. 0: no cap; else 1 to 100000.
    egress_new_connections_per_second: int = 0
    #: Classes whose suspend writes the sandbox's memory and processes to its
    #: disk area and releases its host memory (attach restores them running);
    #: the others, and a machine a class cannot checkpoint, keep the freezer
    #: (memory stays resident). Comma-separated; empty: none
    #: (docs/runtime.md, "Checkpoints").
    checkpoint_classes: str = ""
    #: Ready sandboxes kept per environment so that a new attach need not boot one.
    warm_pool: int = 2
    #: A sandbox's agent (``container`` and ``gvisor`` classes) that has had
    #: nothing to do for this long hands over to a waiter (a bare interpreter of
    #: ~2.3 MiB under runc, the static ``waiter.c`` under gVisor) until its next
    #: request, which then pays the agent's start-up (see docs/performance.md);
    #: 0: never.
    agent_hibernate_seconds: float = 300.0
    #: Base image cache; empty means ``<data_dir>/images`` (tests share one across runs).
    image_dir: str = ""
    #: Built environment layers (declared ``sandbox`` sections); empty means
    #: ``<data_dir>/layers``. Servers on one machine may share one (tests do,
    #: across runs): a layer is keyed by its base image and what it installs.
    layer_dir: str = ""
    #: Volatile per-machine state (sockets, mounts, runc's state); empty means
    #: ``/run/podbay/<hash of data_dir>``. Keep it short: unix socket paths max 107 bytes.
    run_dir: str = ""
    #: Debian mirror the base image is built from.
    image_mirror: str = "http://deb.debian.org/debian"
    #: CA certificates (``*.crt``) the base image trusts besides Debian's: the
    #: host's locally added ones by default (e.g. a TLS-inspecting egress proxy's).
    #: Empty: none. Their contents are part of the image's cache key.
    image_extra_ca_dir: str = "/usr/local/share/ca-certificates"
    #: How long ``start`` waits for the agent to answer before giving up.
    start_timeout_seconds: float = 30.0
    #: The account commands and file calls run as when a request names no
    #: ``user``: root (the reference's behaviour) unless set, e.g. ``user``.
    default_user: str = ""


@dataclass
class LifecycleSettings:
    idle_seconds: float = 15 * 60
    #: Bounds of attach's ``idle_timeout_seconds`` (a sandbox's own idle threshold).
    min_idle_seconds: float = 60
    max_idle_seconds: float = 8 * 60 * 60
    suspended_ttl_seconds: float = 60 * 60
    max_age_seconds: float = 8 * 60 * 60
    #: How often the lifecycle pass runs.
    interval_seconds: float = 10.0


@dataclass
class CapsSettings:
    per_deployment: int = DEFAULT_DEPLOYMENT_SANDBOX_CAP
    per_account: int = 100


@dataclass
class CredentialSettings:
    ttl_seconds: int = CREDENTIAL_TTL_SECONDS
    #: Lifetime of identity tokens (their ``exp``); 0 issues tokens that never
    #: expire. Rotation: docs/platform.md, "Identity tokens and keys".
    identity_ttl_seconds: int = 90 * 24 * 3600


@dataclass
class StoreSettings:
    #: Where state lives: empty is SQLite in the data directory (one host);
    #: ``postgresql://...`` is a PostgreSQL database several servers can share.
    url: str = ""


@dataclass
class ClusterSettings:
    """Split roles (``podbay control`` + ``podbay node``), docs/cluster.md."""

    #: Shared secret a node presents once to enroll; the control plane answers
    #: with a credential for that node alone (kept hashed) for every later call.
    enrollment_token: str = ""
    #: How often a node reports (capacity, activity, health).
    heartbeat_seconds: float = 5.0
    #: A node silent this long is ``lost``: its sandboxes are reported lost and
    #: attach refuses them (never recreated elsewhere) until an operator drains
    #: or forgets the node.
    node_lost_seconds: float = 30.0


@dataclass
class NodeSettings:
    #: Base URL of the control plane (its load balancer).
    control_url: str = ""
    #: This node's name; empty: the host name.
    name: str = ""
    #: URL clients and the control plane reach this node at; its sandboxes'
    #: ``endpoint``. Empty: ``http://{server.host}:{server.port}``.
    advertise_url: str = ""
    #: Sandboxes this node holds at most (running or suspended); 0: as many as
    #: its memory holds at ``runtime.memory_bytes`` each (at least 1).
    max_sandboxes: int = 0


@dataclass
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    caps: CapsSettings = field(default_factory=CapsSettings)
    credentials: CredentialSettings = field(default_factory=CredentialSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    log_level: str = "info"

    @property
    def layer_dir(self) -> Path:
        """Where built environment layers are cached (``runtime.layer_dir``)."""
        return Path(self.runtime.layer_dir) if self.runtime.layer_dir else self.data_dir / "layers"

    @classmethod
    def load(cls, *, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``PODBAY_*`` variables, then ``overrides`` (``None`` skipped)."""
        settings = cls()
        env = os.environ if environ is None else environ
        _apply_env(settings, env, "PODBAY")
        for key, value in overrides.items():
            if value is None:
                continue
            section, _, name = key.partition("__")
            target = getattr(settings, section) if name else settings
            attr = name or section
            if not hasattr(target, attr):
                raise ValueError(f"unknown setting {key}")
            setattr(target, attr, _coerce(_field_type(target, attr), value, key))
        return settings


def _field_type(obj: Any, name: str) -> type:
    """The declared type of a settings field (not the default's: 900 is a float field)."""
    hint = typing.get_type_hints(type(obj))[name]
    return typing.cast(type, hint)


def _apply_env(obj: Any, env: Mapping[str, str], prefix: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}_{f.name.upper()}"
        if dataclasses.is_dataclass(value):
            _apply_env(value, env, name)
        elif name in env:
            setattr(obj, f.name, _coerce(_field_type(obj, f.name), env[name], name))


def _coerce(kind: type, raw: Any, name: str) -> Any:
    if not isinstance(raw, str) or kind is str:
        return raw
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(raw)
            return lowered in {"1", "true", "yes", "on"}
        if issubclass(kind, Path):
            return Path(raw)
        return typing.cast(Any, kind)(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
