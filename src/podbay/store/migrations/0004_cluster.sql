-- Split roles (podbay control + podbay node). Which node holds a sandbox's
-- machine; the all-in-one server's node is 'local'.
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT 'local';
CREATE INDEX sandboxes_node ON sandboxes (node);

-- Sandbox hosts enrolled with the control plane. A node's credential is
-- kept only as its SHA-256; report is the node's last heartbeat (JSON).
CREATE TABLE nodes (
    name            TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    credential_hash TEXT NOT NULL UNIQUE,
    drained         INTEGER NOT NULL DEFAULT 0,
    report          TEXT NOT NULL,
    enrolled_at     REAL NOT NULL,
    heartbeat_at    REAL NOT NULL
);

-- Signing keys shared by every control-plane replica (Ed25519, PKCS#8 PEM).
CREATE TABLE signing_keys (
    kid         TEXT PRIMARY KEY,
    private_pem TEXT NOT NULL,
    created_at  REAL NOT NULL
);

-- Short leases: one holder at a time per key across replicas (a sandbox's
-- transitions), taken and renewed with one statement each.
CREATE TABLE leases (
    key    TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until  REAL NOT NULL
);
