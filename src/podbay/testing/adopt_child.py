"""A throwaway node process for the SIGKILL-then-adopt conformance test.

Reads ``(factory, settings, {state: spec})`` pickled on stdin, builds the
driver, brings each machine to its state (a file ``/workspace/mark`` naming
it), prints ``{"ready": true}`` and waits to be killed.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import pickle
import sys

from podbay.runtime.agent_client import AgentClient


async def main() -> None:
    factory_ref, settings, specs = pickle.loads(sys.stdin.buffer.read())  # noqa: S301
    module, _, attribute = factory_ref.partition(":")
    driver = getattr(importlib.import_module(module), attribute)(settings)
    await driver.prepare()
    for state, spec in specs.items():
        await driver.create(spec)
        await driver.start(spec.machine_id)
        sock = driver.agent_socket(spec.machine_id)
        result = await asyncio.to_thread(AgentClient(sock).sh, f"echo {state} > /workspace/mark")
        assert result.exit_code == 0, result
        if state == "suspended":
            await driver.suspend(spec.machine_id)
        elif state == "stopped":
            await driver.stop(spec.machine_id)
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main())
