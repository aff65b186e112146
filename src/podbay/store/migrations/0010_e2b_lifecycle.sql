-- E2B's lifecycle (docs/e2b.md): what a sandbox's timeout does to it ('kill'
-- or 'pause'), and since when it is paused (by its timeout or E2B's pause):
-- the timeout sweep passes paused ones over until a connect resumes them.
ALTER TABLE e2b_sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill';
ALTER TABLE e2b_sandboxes ADD COLUMN paused_at REAL;
