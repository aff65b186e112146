"""The web console in a real browser: Debian's Chromium driven by Playwright
(headless, never a browser download) against a real ``podbay serve`` with real
sandboxes.

Every page a test opens records the console's errors (``console`` messages of
type error and uncaught exceptions) and any dialog: a test fails on any of
them at its end. Screenshots go to ``$PODBAY_TEST_ARTIFACTS/console/`` or
``test-artifacts/console/`` at the repository's root (gitignored).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright import sync_api as playwright_sync

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[3]
#: Answers the browser logs as errors though they are the page's plan: the
#: signed-out probe of the session (401 is how the server says "no session").
EXPECTED_FAILED_LOADS = ("/console/session",)


def artifacts_dir() -> Path:
    base = os.environ.get("PODBAY_TEST_ARTIFACTS")
    path = (Path(base) if base else REPO / "test-artifacts") / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    if not (REPO / "src/podbay/console/static/index.html").exists():
        pytest.fail("the console is not built: ./run builds it (npm --prefix console run build)")
    with PlatformServer.start(tmp_path_factory.mktemp("console")) as s:
        yield s


@pytest.fixture(scope="module")
def operator_token(console_server: PlatformServer) -> str:
    return console_server.cli("admin", "token").stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def alpha_token(console_server: PlatformServer) -> str:
    return console_server.create_deployment("alpha")


@pytest.fixture(scope="module")
def beta_token(console_server: PlatformServer) -> str:
    return console_server.create_deployment("beta")


@pytest.fixture(scope="module")
def browser(console_server: PlatformServer) -> Iterator[playwright_sync.Browser]:
    # After the server (so closed before it: the server's clean-up runs its own
    # event loop, which it cannot while the sync Playwright's loop is current).
    # For the same reason the browser lives for this module only: left open for
    # the session, it made every later module's asyncio.run fail in a full run.
    del console_server
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: ./run installs Debian's chromium package")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            # As root Chromium refuses its own sandbox; the page is ours and local.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        yield b
        b.close()


@dataclass
class Watched:
    """A page and what went wrong on it."""

    page: playwright_sync.Page
    base_url: str
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def shot(self, name: str) -> Path:
        path = artifacts_dir() / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def sign_in(self, token: str) -> None:
        self.page.goto(self.base_url + "/")
        self.page.get_by_label("Token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.get_by_role("button", name="Sign out").wait_for()


def watch(page: playwright_sync.Page, base_url: str) -> Watched:
    w = Watched(page, base_url)

    def on_console(msg: playwright_sync.ConsoleMessage) -> None:
        if msg.type != "error":
            return
        url = (msg.location or {}).get("url", "")
        if msg.text.startswith("Failed to load resource") and url.endswith(EXPECTED_FAILED_LOADS):
            return
        w.errors.append(f"{msg.text} ({url})")

    def on_dialog(dialog: playwright_sync.Dialog) -> None:
        w.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda exc: w.errors.append(f"uncaught: {exc}"))
    page.on("dialog", on_dialog)
    return w


@pytest.fixture
def console(browser: playwright_sync.Browser, console_server: PlatformServer) -> Iterator[Watched]:
    """A fresh browser context (no cookie) at 1280x800; no errors allowed."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    w = watch(context.new_page(), console_server.url)
    yield w
    pwned = w.page.evaluate("() => window.__pwned")
    context.close()
    assert pwned is None, "a payload ran in the console"
    assert w.dialogs == [], f"dialogs opened: {w.dialogs}"
    assert w.errors == [], f"console errors: {w.errors}"


@pytest.fixture(scope="session", autouse=True)
def _no_stale_shots() -> None:
    shutil.rmtree(artifacts_dir(), ignore_errors=True)
    artifacts_dir()
