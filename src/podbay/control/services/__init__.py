"""Control-plane services: plain async classes, no web framework, no HTTP
errors (they raise :class:`podbay.errors.ApiError`)."""
