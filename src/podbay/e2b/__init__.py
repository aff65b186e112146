"""E2B compatibility: E2B's SDKs (``e2b``, ``e2b-code-interpreter``) work
against podbay unchanged (docs/e2b.md).

- :mod:`.control`: E2B's REST API (``E2B_API_URL``): sandboxes by API key.
- :mod:`.envd`: the sandbox API (``E2B_SANDBOX_URL``): envd's process service
  (Connect RPC) and ``/files``, relayed to the sandbox's agent through the gateway.
- :mod:`.service`: what both share: keys, access tokens, the sandbox rows.
- :mod:`.app`: which requests are E2B's, for ``podbay serve``'s ASGI entry.
"""
