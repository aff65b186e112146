-- Sandbox classes: a record names the class its machine actually runs in.
-- Every sandbox made before classes existed is a runc container whose
-- machine lives in the container class's data, so 'default' becomes that.
UPDATE sandboxes SET class = 'container' WHERE class = 'default';
