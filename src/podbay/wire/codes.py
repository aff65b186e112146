"""Refusal codes and the HTTP status each one travels with.

A refusal's body is always ``{"error": "<sentence>", "code": "<CODE>"}``.
The control plane, the gateway and the agent answer with these codes; the
client maps them back to its exception classes. Codes are the reference's
UPPER_SNAKE names where the reference names one.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # -- any endpoint ------------------------------------------------------
    REQUEST_INVALID = "REQUEST_INVALID"  # malformed JSON, wrong types, unknown fields
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"  # a body over the endpoint's limit
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"  # the request head did not arrive in time
    ROUTE_NOT_FOUND = "ROUTE_NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    INTERNAL = "INTERNAL"

    # -- control plane -----------------------------------------------------
    IDENTITY_TOKEN_INVALID = "IDENTITY_TOKEN_INVALID"  # missing, forged, expired, unknown
    SANDBOX_NAME_INVALID = "SANDBOX_NAME_INVALID"
    SANDBOX_LIMIT_REACHED = "SANDBOX_LIMIT_REACHED"
    SANDBOX_NOT_FOUND = "SANDBOX_NOT_FOUND"
    SANDBOXES_NOT_CONFIGURED = "SANDBOXES_NOT_CONFIGURED"
    SANDBOX_NOT_DECLARED = "SANDBOX_NOT_DECLARED"
    SANDBOX_CLASS_UNKNOWN = "SANDBOX_CLASS_UNKNOWN"  # not a class name at all
    #: A known class this server does not run (not enabled, or not working on
    #: this host); the message names the classes it can run.
    SANDBOX_CLASS_UNAVAILABLE = "SANDBOX_CLASS_UNAVAILABLE"
    #: The sandbox exists in another class than the one asked for by name.
    SANDBOX_CLASS_CONFLICT = "SANDBOX_CLASS_CONFLICT"
    #: Attach's options: a label or variable that is not one, a figure outside
    #: the operator's bounds (the code names the bound), or options other than
    #: those the existing sandbox was created with.
    SANDBOX_LABELS_INVALID = "SANDBOX_LABELS_INVALID"
    SANDBOX_ENV_INVALID = "SANDBOX_ENV_INVALID"
    SANDBOX_CPUS_BELOW_MIN = "SANDBOX_CPUS_BELOW_MIN"
    SANDBOX_CPUS_ABOVE_MAX = "SANDBOX_CPUS_ABOVE_MAX"
    SANDBOX_MEMORY_BELOW_MIN = "SANDBOX_MEMORY_BELOW_MIN"
    SANDBOX_MEMORY_ABOVE_MAX = "SANDBOX_MEMORY_ABOVE_MAX"
    SANDBOX_IDLE_TIMEOUT_BELOW_MIN = "SANDBOX_IDLE_TIMEOUT_BELOW_MIN"
    SANDBOX_IDLE_TIMEOUT_ABOVE_MAX = "SANDBOX_IDLE_TIMEOUT_ABOVE_MAX"
    SANDBOX_OPTIONS_CONFLICT = "SANDBOX_OPTIONS_CONFLICT"
    #: An egress policy (``network``) that is not one: its shape (unknown keys,
    #: wrong types, ``internet: false`` with lists), an entry that is neither a
    #: CIDR nor a domain name (the message names it), or over the bounds.
    SANDBOX_NETWORK_INVALID = "SANDBOX_NETWORK_INVALID"
    SANDBOX_NETWORK_ENTRY_INVALID = "SANDBOX_NETWORK_ENTRY_INVALID"
    SANDBOX_NETWORK_TOO_LARGE = "SANDBOX_NETWORK_TOO_LARGE"
    #: ``PUT .../network`` could not be put in force now (the sandbox changed
    #: meanwhile, or its machine did not take the rules): sent with
    #: ``Retry-After``; repeat the call.
    SANDBOX_NETWORK_NOT_APPLIED = "SANDBOX_NETWORK_NOT_APPLIED"
    SANDBOX_PREPARE_FAILED = "SANDBOX_PREPARE_FAILED"
    SANDBOX_APPLY_FAILED = "SANDBOX_APPLY_FAILED"
    SANDBOX_START_FAILED = "SANDBOX_START_FAILED"
    SANDBOXES_UNAVAILABLE = "SANDBOXES_UNAVAILABLE"
    #: The node that holds the sandbox stopped answering (split roles): its
    #: sandbox is not recreated elsewhere until an operator drains or forgets
    #: that node (``podbay node drain|forget``).
    SANDBOX_NODE_LOST = "SANDBOX_NODE_LOST"
    # Fork (issue 27): a new name another sandbox of the deployment holds; more
    # copies than one call makes, or none, or a name twice; a class whose
    # driver cannot copy a machine.
    SANDBOX_NAME_TAKEN = "SANDBOX_NAME_TAKEN"
    SANDBOX_FORK_INVALID = "SANDBOX_FORK_INVALID"
    SANDBOX_FORK_UNSUPPORTED = "SANDBOX_FORK_UNSUPPORTED"
    #: The host's free disk is below the operator's reserve: no new sandbox.
    HOST_DISK_FULL = "HOST_DISK_FULL"
    #: The server shut down while the request was in flight (past its grace):
    #: clients re-attach (riding over the restart) and repeat the call.
    SERVER_SHUTTING_DOWN = "SERVER_SHUTTING_DOWN"
    #: The shared store (PostgreSQL) went away under the request (shutting
    #: down, failing over) and could not be reached again: sent with
    #: ``Retry-After``; nothing the request asked for was done, or it is
    #: unknown only when the connection died during the commit itself.
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"

    # -- console and admin API (docs/console.md) -----------------------------
    #: A sign-in or admin call's token is neither a valid operator token nor
    #: (for sign-in) a deployment's identity token.
    TOKEN_INVALID = "TOKEN_INVALID"
    #: No console session cookie, or an expired, forged or revoked one.
    SESSION_INVALID = "SESSION_INVALID"
    #: A state-changing call made with the session cookie lacks the session's
    #: CSRF token, or a call with the cookie came from another site.
    CSRF_INVALID = "CSRF_INVALID"
    #: An operator-only call made with a deployment's token or session.
    OPERATOR_REQUIRED = "OPERATOR_REQUIRED"
    #: An operator session's sandbox call names no deployment (X-Podbay-Deployment).
    DEPLOYMENT_REQUIRED = "DEPLOYMENT_REQUIRED"
    DEPLOYMENT_NOT_FOUND = "DEPLOYMENT_NOT_FOUND"
    #: A deployment session named another deployment.
    DEPLOYMENT_FORBIDDEN = "DEPLOYMENT_FORBIDDEN"
    DEPLOYMENT_EXISTS = "DEPLOYMENT_EXISTS"
    NODE_NOT_FOUND = "NODE_NOT_FOUND"
    #: A cluster-only call (drain) made to ``podbay serve``.
    NOT_A_CLUSTER = "NOT_A_CLUSTER"
    #: Volumes (docs/volumes.md): a name or size that cannot be one, a name
    #: taken, none of that name, one still named by a sandbox (delete), a
    #: mount a class cannot make, or a server that keeps no volumes.
    VOLUME_NAME_INVALID = "VOLUME_NAME_INVALID"
    VOLUME_SIZE_INVALID = "VOLUME_SIZE_INVALID"
    VOLUME_EXISTS = "VOLUME_EXISTS"
    VOLUME_NOT_FOUND = "VOLUME_NOT_FOUND"
    VOLUME_IN_USE = "VOLUME_IN_USE"
    VOLUME_MOUNT_INVALID = "VOLUME_MOUNT_INVALID"
    VOLUME_CLASS_UNSUPPORTED = "VOLUME_CLASS_UNSUPPORTED"
    VOLUMES_UNAVAILABLE = "VOLUMES_UNAVAILABLE"
    #: A path of a volume's files API that is not one, or leaves the volume.
    VOLUME_PATH_INVALID = "VOLUME_PATH_INVALID"
    VOLUME_PATH_NOT_FOUND = "VOLUME_PATH_NOT_FOUND"
    VOLUME_FULL = "VOLUME_FULL"

    # -- internal API (control plane and nodes) ------------------------------
    #: Missing, unknown or wrong kind of node credential (a data-plane
    #: credential or an identity token is never one).
    NODE_CREDENTIAL_INVALID = "NODE_CREDENTIAL_INVALID"
    #: Enrollment under the name of a node already enrolled: a node keeps its
    #: name (and URL) until an operator forgets it (``podbay node forget``).
    NODE_NAME_TAKEN = "NODE_NAME_TAKEN"

    # -- gateway (credentials) ---------------------------------------------
    CREDENTIAL_INVALID = "CREDENTIAL_INVALID"  # missing, expired, forged
    #: The sandbox the credential names is not running any more (stopped,
    #: suspended or reclaimed). 401 so that every client re-attaches, which
    #: resumes or recreates it, and repeats the call.
    SANDBOX_NOT_RUNNING = "SANDBOX_NOT_RUNNING"
    CREDENTIAL_WRONG_SANDBOX = "CREDENTIAL_WRONG_SANDBOX"
    AGENT_UNREACHABLE = "AGENT_UNREACHABLE"
    #: The agent did not start its answer in time (``server.agent_answer_seconds``,
    #: after the exec's own timeout for an exec): the machine is checked, and
    #: stopped when its agent stays silent, so the next attach restarts it.
    AGENT_TIMEOUT = "AGENT_TIMEOUT"
    #: The sandbox has as many requests under way and waiting as the gateway
    #: holds for one sandbox (``server.sandbox_requests``, ``sandbox_queue``):
    #: sent with ``Retry-After``.
    SANDBOX_BUSY = "SANDBOX_BUSY"
    #: Nothing inside the sandbox accepts connections on the port asked for.
    PORT_UNREACHABLE = "PORT_UNREACHABLE"

    # -- agent: commands and processes -------------------------------------
    COMMAND_START_FAILED = "COMMAND_START_FAILED"
    PROCESS_LIMIT_REACHED = "PROCESS_LIMIT_REACHED"
    PROCESS_NOT_FOUND = "PROCESS_NOT_FOUND"
    SIGNAL_INVALID = "SIGNAL_INVALID"
    #: The process has no stdin pipe (spawned without ``stdin``) or it is closed.
    PROCESS_STDIN_CLOSED = "PROCESS_STDIN_CLOSED"
    #: ``user`` names no account of the sandbox.
    USER_UNKNOWN = "USER_UNKNOWN"

    # -- agent: files ------------------------------------------------------
    PATH_INVALID = "PATH_INVALID"
    PATH_NOT_FOUND = "PATH_NOT_FOUND"
    PATH_IS_DIRECTORY = "PATH_IS_DIRECTORY"
    PATH_NOT_DIRECTORY = "PATH_NOT_DIRECTORY"
    PATH_EXISTS = "PATH_EXISTS"
    PATH_ACCESS_DENIED = "PATH_ACCESS_DENIED"
    DIRECTORY_NOT_EMPTY = "DIRECTORY_NOT_EMPTY"
    DIGEST_MISMATCH = "DIGEST_MISMATCH"
    DIGEST_MISSING = "DIGEST_MISSING"
    NO_SPACE = "NO_SPACE"

    @property
    def status(self) -> int:
        """The HTTP status this code is sent with."""
        return STATUS[self]


STATUS: dict[ErrorCode, int] = {
    ErrorCode.REQUEST_INVALID: 400,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.ROUTE_NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.INTERNAL: 500,
    ErrorCode.IDENTITY_TOKEN_INVALID: 401,
    ErrorCode.SANDBOX_NAME_INVALID: 400,
    ErrorCode.SANDBOX_LIMIT_REACHED: 402,
    ErrorCode.SANDBOX_NOT_FOUND: 404,
    ErrorCode.SANDBOXES_NOT_CONFIGURED: 409,
    ErrorCode.SANDBOX_NOT_DECLARED: 409,
    ErrorCode.SANDBOX_CLASS_UNKNOWN: 409,
    ErrorCode.SANDBOX_CLASS_UNAVAILABLE: 409,
    ErrorCode.SANDBOX_CLASS_CONFLICT: 409,
    ErrorCode.SANDBOX_LABELS_INVALID: 400,
    ErrorCode.SANDBOX_ENV_INVALID: 400,
    ErrorCode.SANDBOX_NETWORK_INVALID: 400,
    ErrorCode.SANDBOX_NETWORK_ENTRY_INVALID: 400,
    ErrorCode.SANDBOX_NETWORK_TOO_LARGE: 400,
    ErrorCode.SANDBOX_NETWORK_NOT_APPLIED: 503,
    ErrorCode.SANDBOX_CPUS_BELOW_MIN: 400,
    ErrorCode.SANDBOX_CPUS_ABOVE_MAX: 400,
    ErrorCode.SANDBOX_MEMORY_BELOW_MIN: 400,
    ErrorCode.SANDBOX_MEMORY_ABOVE_MAX: 400,
    ErrorCode.SANDBOX_IDLE_TIMEOUT_BELOW_MIN: 400,
    ErrorCode.SANDBOX_IDLE_TIMEOUT_ABOVE_MAX: 400,
    ErrorCode.SANDBOX_OPTIONS_CONFLICT: 409,
    ErrorCode.SANDBOX_PREPARE_FAILED: 409,
    ErrorCode.SANDBOX_APPLY_FAILED: 409,
    ErrorCode.SANDBOX_START_FAILED: 502,
    ErrorCode.SANDBOXES_UNAVAILABLE: 503,
    ErrorCode.SANDBOX_NODE_LOST: 409,
    ErrorCode.SANDBOX_NAME_TAKEN: 409,
    ErrorCode.SANDBOX_FORK_INVALID: 400,
    ErrorCode.SANDBOX_FORK_UNSUPPORTED: 409,
    ErrorCode.TOKEN_INVALID: 401,
    ErrorCode.SESSION_INVALID: 401,
    ErrorCode.CSRF_INVALID: 403,
    ErrorCode.OPERATOR_REQUIRED: 403,
    ErrorCode.DEPLOYMENT_REQUIRED: 400,
    ErrorCode.DEPLOYMENT_NOT_FOUND: 404,
    ErrorCode.DEPLOYMENT_FORBIDDEN: 403,
    ErrorCode.DEPLOYMENT_EXISTS: 409,
    ErrorCode.VOLUME_NAME_INVALID: 400,
    ErrorCode.VOLUME_SIZE_INVALID: 400,
    ErrorCode.VOLUME_EXISTS: 409,
    ErrorCode.VOLUME_NOT_FOUND: 404,
    ErrorCode.VOLUME_IN_USE: 409,
    ErrorCode.VOLUME_MOUNT_INVALID: 400,
    ErrorCode.VOLUME_CLASS_UNSUPPORTED: 409,
    ErrorCode.VOLUMES_UNAVAILABLE: 501,
    ErrorCode.VOLUME_PATH_INVALID: 400,
    ErrorCode.VOLUME_PATH_NOT_FOUND: 404,
    ErrorCode.VOLUME_FULL: 507,
    ErrorCode.NODE_NOT_FOUND: 404,
    ErrorCode.NOT_A_CLUSTER: 409,
    ErrorCode.NODE_CREDENTIAL_INVALID: 401,
    ErrorCode.NODE_NAME_TAKEN: 409,
    ErrorCode.HOST_DISK_FULL: 507,
    ErrorCode.SERVER_SHUTTING_DOWN: 503,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.CREDENTIAL_INVALID: 401,
    ErrorCode.SANDBOX_NOT_RUNNING: 401,
    ErrorCode.CREDENTIAL_WRONG_SANDBOX: 403,
    ErrorCode.AGENT_UNREACHABLE: 502,
    ErrorCode.AGENT_TIMEOUT: 504,
    ErrorCode.SANDBOX_BUSY: 429,
    ErrorCode.PORT_UNREACHABLE: 502,
    ErrorCode.COMMAND_START_FAILED: 400,
    ErrorCode.PROCESS_LIMIT_REACHED: 429,
    ErrorCode.PROCESS_NOT_FOUND: 404,
    ErrorCode.SIGNAL_INVALID: 400,
    ErrorCode.PROCESS_STDIN_CLOSED: 409,
    ErrorCode.USER_UNKNOWN: 400,
    ErrorCode.PATH_INVALID: 400,
    ErrorCode.PATH_NOT_FOUND: 404,
    ErrorCode.PATH_IS_DIRECTORY: 400,
    ErrorCode.PATH_NOT_DIRECTORY: 400,
    ErrorCode.PATH_EXISTS: 409,
    # Not 403: a 403 tells clients to re-attach (credential for another sandbox).
    ErrorCode.PATH_ACCESS_DENIED: 409,
    ErrorCode.DIRECTORY_NOT_EMPTY: 409,
    ErrorCode.DIGEST_MISMATCH: 422,
    ErrorCode.DIGEST_MISSING: 400,
    ErrorCode.NO_SPACE: 507,
}

#: The two codes for which clients raise ``SandboxNotEnabledError``.
NOT_ENABLED_CODES: frozenset[str] = frozenset(
    {ErrorCode.SANDBOXES_NOT_CONFIGURED, ErrorCode.SANDBOX_NOT_DECLARED}
)


def error_body(code: ErrorCode, message: str) -> dict[str, str]:
    """The contract's refusal body."""
    return {"error": message, "code": code.value}
