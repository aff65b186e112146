-- The class word a sandbox was asked for ('default' when none): the contract
-- shows it as `class` (the reference client's handles say "Always `default`"),
-- beside the class it runs (the `class` column, shown as `runtime_class`).
-- Rows made before this were all shown as what they run; the reference's
-- callers only ever ask for 'default', so that is their word.
ALTER TABLE sandboxes ADD COLUMN asked_class TEXT NOT NULL DEFAULT 'default';
