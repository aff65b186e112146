CREATE TABLE deployments (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    account         TEXT NOT NULL,
    spec_text       TEXT NOT NULL,
    sandbox_section TEXT,            -- JSON of the raw section; NULL when absent
    created_at      REAL NOT NULL,   -- unix seconds
    updated_at      REAL NOT NULL
);

CREATE TABLE sandboxes (
    id             TEXT PRIMARY KEY,
    deployment_id  TEXT NOT NULL,
    account        TEXT NOT NULL,
    name           TEXT NOT NULL,
    class          TEXT NOT NULL,
    state          TEXT NOT NULL,
    machine_id     TEXT NOT NULL UNIQUE,
    created_at     REAL NOT NULL,
    last_active_at REAL NOT NULL,
    started_at     REAL,
    ceiling_at     REAL,
    incarnation    INTEGER NOT NULL DEFAULT 0,
    version        INTEGER NOT NULL DEFAULT 0,
    UNIQUE (deployment_id, name)
);
CREATE INDEX sandboxes_account ON sandboxes (account);
CREATE INDEX sandboxes_state ON sandboxes (state);

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
