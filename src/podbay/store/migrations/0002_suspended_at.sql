-- When a sandbox last left ``running`` (suspended or stopped): reclaim counts
-- from here, not from its last activity. Rows already suspended or stopped
-- count from their last activity, the best this schema knew.
ALTER TABLE sandboxes ADD COLUMN suspended_at REAL;
UPDATE sandboxes SET suspended_at = last_active_at WHERE state IN ('suspended', 'stopped');
