-- Where a running sandbox's route is known to be published: the boot id of
-- the node process that took it (a node's routes live in its memory, so a
-- restart, which changes the boot id, loses them). Set after the node took
-- the route, cleared before the route is withdrawn and by every compare-and-set
-- write, so a replica that finds it equal to the node's reported boot may
-- attach without calling the node. NULL: not known; publish again.
ALTER TABLE sandboxes ADD COLUMN routed_on TEXT;
