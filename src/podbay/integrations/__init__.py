"""Adapters for agent frameworks, each behind its extra and imported only when used:

- ``podbay mcp`` / :mod:`podbay.integrations.mcp` (``pip install 'podbay[mcp]'``):
  podbay as Model Context Protocol tools, over stdio or streamable HTTP.
- :mod:`podbay.integrations.smolagents` (``pip install 'podbay[smolagents]'``):
  a remote Python executor for smolagents' CodeAgent, on top of ``run_code``.
- :mod:`podbay.integrations.inspect_ai` (``pip install 'podbay[inspect-ai]'``):
  the inspect_ai sandbox type ``"podbay"``, registered through inspect's entry point.
- :mod:`podbay.integrations.deepagents` (``pip install 'podbay[deepagents]'``):
  ``PodbaySandbox``, a sandbox backend for LangChain deepagents.
- :mod:`podbay.integrations.openai_agents` (``pip install 'podbay[openai-agents]'``):
  ``PodbaySandboxClient``, sandbox sessions for the OpenAI Agents SDK's sandbox agents.

Importing :mod:`podbay` (or this package) never imports a framework.
"""
