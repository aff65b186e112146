// A terminal in the sandbox: xterm.js over the PTY WebSocket. Terminal bytes
// go only through xterm.js (it interprets escape sequences itself and never
// turns output into markup); control messages are JSON text frames.
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { dataPath } from "./api";
import { h } from "./dom";

export interface TerminalView {
  element: HTMLElement;
  dispose(): void;
}

export function openTerminal(name: string, onLeave: () => void, command: string[] = ["/bin/bash", "-l"]): TerminalView {
  const status = h("p", { class: "muted term-status", role: "status" }, "connecting…");
  const host = h("div", { class: "term", "data-testid": "terminal" });
  const element = h("section", { class: "terminal-pane", "aria-label": "Terminal" }, host, status);
  const term = new Terminal({
    // A steady cursor (xterm.js's own default): its blink is a CSS animation
    // that makes the browser render a frame every 1/60 s while the terminal
    // shows, so each echo waited for the next of those frames (17 ms at p50
    // in headless Chromium) instead of being drawn as it arrived
    // (docs/performance.md, "The web console").
    cursorBlink: false,
    fontSize: 14,
    scrollback: 5000,
    allowProposedApi: false,
    // Hyperlinks (OSC 8) are the sandbox's: only http(s) ones open, in a new
    // context with no opener, and without xterm.js's confirm() dialog.
    linkHandler: {
      allowNonHttpProtocols: false,
      activate: (_ev, uri) => {
        if (/^https?:\/\//i.test(uri)) window.open(uri, "_blank", "noopener,noreferrer");
      },
    },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);

  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}${dataPath(name)}/v1/pty`);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  let opened = false;

  const sendSize = () => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));
  };
  ws.addEventListener("open", () => {
    opened = true;
    ws.send(JSON.stringify({ command, rows: term.rows, cols: term.cols, term: "xterm-256color" }));
    status.textContent = "connected";
    performance.mark("podbay:terminal-open");
    term.focus();
  });
  ws.addEventListener("message", (ev) => {
    if (ev.data instanceof ArrayBuffer) {
      term.write(new Uint8Array(ev.data));
      return;
    }
    try {
      const msg = JSON.parse(String(ev.data)) as { type?: string; exit_code?: number; error?: string; code?: string };
      if (msg.type === "exit") status.textContent = `exited with ${msg.exit_code ?? "?"}`;
      else if (msg.error) status.textContent = `refused: ${msg.error} (${msg.code ?? ""})`;
    } catch {
      // an unknown control message: nothing to show
    }
  });
  ws.addEventListener("close", () => {
    if (!opened) status.textContent = "could not connect";
    else if (status.textContent === "connected") status.textContent = "disconnected";
  });
  // The terminal takes Tab (completion); Shift+Tab leaves it for the page's
  // controls instead, so a keyboard is never trapped in it.
  term.attachCustomKeyEventHandler((ev) => {
    if (ev.key !== "Tab" || !ev.shiftKey) return true;
    if (ev.type === "keydown") {
      ev.preventDefault();
      onLeave();
    }
    return false;
  });
  term.onData((data) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
  });
  term.onBinary((data) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff));
  });
  term.onResize(sendSize);

  // Opened once the element is in the document (xterm measures its cells).
  const observer = new ResizeObserver(() => {
    if (!term.element) {
      term.open(host);
      term.focus(); // the socket may have opened first, when there was nothing to focus
    }
    try {
      fit.fit();
    } catch {
      // hidden (another tab): measured again when shown
    }
  });
  observer.observe(host);

  return {
    element,
    dispose() {
      observer.disconnect();
      ws.close();
      term.dispose();
    },
  };
}
