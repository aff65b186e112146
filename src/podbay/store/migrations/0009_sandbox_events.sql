-- Per-sandbox lifecycle events (docs/observability.md), newest kept per name
-- (bounded by the writer). Keyed by the deployment and the sandbox's name, not
-- its id, so a removed sandbox's history (its "removed" event among it) stays
-- readable by that name until the deployment goes.
CREATE TABLE sandbox_events (
    deployment_id TEXT NOT NULL,
    name          TEXT NOT NULL,
    sandbox_id    TEXT NOT NULL,
    at            REAL NOT NULL,
    kind          TEXT NOT NULL,
    reason        TEXT NOT NULL
);
CREATE INDEX sandbox_events_name ON sandbox_events (deployment_id, name, at);
