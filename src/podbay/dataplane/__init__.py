"""What both planes share below them: data-plane credentials, activity, the
agent exchange, the route table, the node protocol and the environment seam."""
