"""The wheel carries the built web console (src/podbay/console/static/), so
``pip install 'podbay[server]'`` serves it without node.

The build is not committed (.gitignore); ``[tool.hatch.build] artifacts``
puts it in the wheel and the sdist all the same. Building a wheel or sdist
from a checkout builds the console first where npm is installed (npm ci
when node_modules is missing, npm run build: what ``./run`` does), so the
wheel never carries a stale build; without npm, a build already there is
used. From an sdist it is there already. An editable install (``./run``'s
own) builds nothing: ``./run`` does it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ConsoleBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        root = Path(self.root)
        static = root / "src" / "podbay" / "console" / "static" / "index.html"
        console = root / "console"
        npm = shutil.which("npm")
        if not (console / "package.json").is_file() or (npm is None and static.is_file()):
            return
        if npm is None:
            raise RuntimeError(
                "building podbay from a checkout builds its web console: install node and "
                "npm (Debian: nodejs npm), or run ./run once"
            )
        if not (console / "node_modules").is_dir():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=console, check=True)
        subprocess.run([npm, "run", "--silent", "build"], cwd=console, check=True)
