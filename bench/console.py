"""The web console in Debian's Chromium: page load to interactive and terminal
keystroke echo through the browser; medians.

    .venv/bin/python bench/console.py                         # a real `podbay serve`
    .venv/bin/python bench/console.py --server URL --token T  # an already running server

Load: a new browser context each run (nothing cached, the session cookie
set), the sandboxes page opened; "interactive" is the page's own mark
``podbay:ready`` (session checked, list fetched and drawn, handlers bound),
read from the Performance timeline, so it counts from navigation start.
"Terminal open" is the mark set when a sandbox page's PTY WebSocket is open.

Echo: on that page's terminal (bash at its prompt), one key pressed at a
time. "to the WebSocket" is the time from the page sending the key's bytes to
the echo's bytes arriving (gateway, agent, pty and back); "to the screen" is
from the keydown event to xterm.js's DOM changing (it draws in the browser's
next animation frame). Both are measured inside the page (``performance.now()``
in an init script), not through Playwright's round trips. ``--chromium-arg``
adds switches (say ``--disable-gpu-vsync --disable-frame-rate-limit``) to see
how much of the screen figure is the browser's frame pacing.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from playwright.sync_api import BrowserContext, sync_playwright

from podbay import SandboxClient
from podbay.testing.target import bench_arguments, bench_target

CHROMIUM = "/usr/bin/chromium"
#: Times, in the page, of keydowns, sent input bytes, received output bytes and DOM changes.
PROBE = """
window.__bench = { keys: [], sent: [], echoed: [], drawn: [] };
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(url, protocols) {
    super(url, protocols);
    this.addEventListener("message", (ev) => {
      if (typeof ev.data !== "string") window.__bench.echoed.push(performance.now());
    });
  }
  send(data) {
    if (typeof data !== "string") window.__bench.sent.push(performance.now());
    return super.send(data);
  }
};
window.addEventListener("keydown", () => window.__bench.keys.push(performance.now()), true);
new MutationObserver(() => window.__bench.drawn.push(performance.now()))
  .observe(document, { subtree: true, childList: true, characterData: true });
"""


def first_after(times: list[float], t: float) -> float | None:
    return next((x for x in times if x >= t), None)


def load_times(ctx_for: Any, url: str, runs: int) -> list[float]:
    ready: list[float] = []
    for _ in range(runs):
        ctx: BrowserContext = ctx_for()
        page = ctx.new_page()
        page.goto(url + "/console/app/sandboxes")
        page.wait_for_function("() => performance.getEntriesByName('podbay:ready').length > 0")
        ready.append(page.evaluate("performance.getEntriesByName('podbay:ready')[0].startTime"))
        ctx.close()
    return ready


def main() -> int:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="page loads")
    parser.add_argument("--keys", type=int, default=100, help="keystrokes")
    parser.add_argument(
        "--chromium-arg",
        action="append",
        default=[],
        help="one more Chromium switch (repeat), e.g. --chromium-arg=--disable-frame-rate-limit "
        "to see how much of the echo is the browser's frame pacing",
    )
    args = parser.parse_args()
    name = f"bench-console-{os.getpid()}"
    local = "podbay serve (real container sandbox, gateway, loopback), Debian's Chromium headless"
    with bench_target(args.server, args.token, local) as target:
        print(f"target: {target.description}")
        if args.chromium_arg:
            print(f"chromium switches: {' '.join(args.chromium_arg)}")
        with SandboxClient(identity_token=target.token, server_url=target.url) as client:
            client.attach(name)
            try:
                figures = measure(
                    target.url, target.token, name, args.runs, args.keys, args.chromium_arg
                )
            finally:
                client.delete(name)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:42} {value:8.1f} ms")
    return 0


def measure(
    url: str, token: str, name: str, runs: int, keys: int, extra: list[str]
) -> dict[str, float]:
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", *extra]
        )
        signed = browser.new_context()
        answer = signed.request.post(f"{url}/console/session", data={"token": token})
        assert answer.ok, answer.text()
        state = signed.storage_state()
        signed.close()

        def fresh() -> BrowserContext:
            return browser.new_context(storage_state=state, viewport={"width": 1280, "height": 800})

        fresh().close()  # the browser's own first start is not the page's
        ready = load_times(fresh, url, runs)
        opened: list[float] = []
        for _ in range(max(3, runs // 4)):
            ctx = fresh()
            page = ctx.new_page()
            page.goto(f"{url}/console/app/sandboxes/{name}")
            mark = "performance.getEntriesByName('podbay:terminal-open')"
            page.wait_for_function(f"() => {mark}.length > 0")
            opened.append(page.evaluate(f"{mark}[0].startTime"))
            ctx.close()

        ctx = fresh()
        ctx.add_init_script(PROBE)
        page = ctx.new_page()
        page.goto(f"{url}/console/app/sandboxes/{name}")
        page.get_by_text("connected", exact=True).wait_for()
        page.wait_for_function("() => window.__bench.echoed.length > 0")  # the prompt
        wire: list[float] = []
        screen: list[float] = []
        to_send: list[float] = []
        to_draw: list[float] = []
        for i in range(keys):
            if i and i % 60 == 0:
                cleared = page.evaluate("window.__bench.echoed.length")  # before: no race
                page.keyboard.press("Control+U")  # keep the line short
                page.wait_for_function("(n) => window.__bench.echoed.length > n", arg=cleared)
            before = page.evaluate("window.__bench.echoed.length")
            page.keyboard.press("x")
            page.wait_for_function(
                """(n) => { const b = window.__bench;
                   return b.echoed.length > n && b.drawn.some((t) => t > b.echoed[n]); }""",
                arg=before,
            )
            b = page.evaluate("window.__bench")
            sent = b["sent"][-1]
            echoed = first_after(b["echoed"], sent)
            drawn = first_after(b["drawn"], echoed) if echoed is not None else None
            if echoed is not None and drawn is not None:
                wire.append(echoed - sent)
                screen.append(drawn - b["keys"][-1])
                to_send.append(sent - b["keys"][-1])
                to_draw.append(drawn - echoed)
        ctx.close()
        browser.close()
    return {
        "page load to interactive (median)": statistics.median(ready),
        "sandbox page to terminal open (median)": statistics.median(opened),
        "keystroke echo to the WebSocket (p50)": statistics.median(wire),
        "keystroke echo to the screen (p50)": statistics.median(screen),
        "keystroke echo to the screen (p90)": statistics.quantiles(screen, n=10)[-1],
        "  of which keydown to bytes sent (p50)": statistics.median(to_send),
        "  of which echo received to drawn (p50)": statistics.median(to_draw),
    }


if __name__ == "__main__":
    raise SystemExit(main())
