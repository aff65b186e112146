-- What attach set on a new sandbox beyond its class (labels, variables, CPU,
-- memory, idle timeout) as one JSON document; NULL: nothing, the server's
-- settings apply. One column, so options added later need no migration.
ALTER TABLE sandboxes ADD COLUMN options TEXT;
