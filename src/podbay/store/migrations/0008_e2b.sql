-- E2B compatibility (docs/e2b.md). API keys: the SHA-256 of the key, never
-- the key; a revoked key keeps its row (revoked_at set) so the operator can
-- tell it was once issued.
CREATE TABLE e2b_keys (
    key_hash      TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    created_at    REAL NOT NULL,
    revoked_at    REAL
);
CREATE INDEX e2b_keys_deployment ON e2b_keys (deployment_id);

-- What E2B's API says of a sandbox that podbay's own record has no field for.
-- sandbox_id is E2B's id and the podbay sandbox's name in its deployment.
CREATE TABLE e2b_sandboxes (
    sandbox_id    TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    template      TEXT NOT NULL,
    metadata      TEXT NOT NULL,   -- JSON object of strings
    env_vars      TEXT NOT NULL,   -- JSON object of strings
    started_at    REAL NOT NULL,
    end_at        REAL NOT NULL    -- unix seconds: killed then (E2B's timeout)
);
CREATE INDEX e2b_sandboxes_deployment ON e2b_sandboxes (deployment_id);
CREATE INDEX e2b_sandboxes_end ON e2b_sandboxes (end_at);
