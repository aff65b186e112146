// One sandbox: a live terminal, files, processes, events and command log,
// metrics charts. Tabs are buttons (role=tab), arrow keys move between them.
import { ApiError, call, dataPath, enc, json, sandboxPath, type Sample, type SandboxRow } from "../api";
import { chart } from "../charts";
import { age, button, clear, formatBytes, h, toast } from "../dom";
import { navigate } from "../router";
import { openTerminal, type TerminalView } from "../terminal";
import { filesPane } from "./files";

interface Process {
  process_id: string;
  command: string[];
  state: string;
  exit_code?: number | null;
  started_at?: string;
}

interface Event {
  at: string;
  kind: string;
  reason?: string | null;
}

interface Command {
  at: string;
  argv: string[];
  user?: string | null;
  exit_code?: number | null;
  duration_ms?: number | null;
  kind?: string;
}

/** How often the open pane asks again (the stream carries only the list). */
const POLL_MS = 2000;

function poller(fn: () => Promise<void>): () => void {
  let stopped = false;
  let timer = 0;
  const tick = async () => {
    if (stopped) return;
    await fn().catch(() => undefined);
    if (!stopped) timer = window.setTimeout(tick, POLL_MS);
  };
  void tick();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

function processesPane(name: string): [HTMLElement, () => void] {
  const list = h("tbody");
  const pane = h(
    "section",
    { class: "processes", "aria-label": "Processes" },
    h("div", { class: "scroll" }, h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ...["ID", "Command", "State", "Exit", "Started", "Actions"].map((c) => h("th", { scope: "col" }, c)))), list)),
  );
  const load = async () => {
    const procs = (await json<{ processes: Process[] }>(`${dataPath(name)}/v1/processes`, { scoped: true })).processes;
    const focused = (document.activeElement as HTMLElement | null)?.closest?.("tr")?.dataset.id;
    clear(list);
    for (const p of procs) {
      const kill = button("Kill", async () => {
        try {
          await call(`${dataPath(name)}/v1/processes/${enc(p.process_id)}/signal`, { method: "POST", body: { signal: "KILL" }, scoped: true });
          toast(`Killed ${p.process_id}`);
          await load();
        } catch (e) {
          toast(e instanceof ApiError ? e.message : "kill failed", "error");
        }
      }, { class: "danger", "aria-label": `Kill ${p.process_id}`, disabled: p.state !== "running" });
      list.appendChild(
        h(
          "tr",
          { "data-id": p.process_id },
          h("td", { class: "mono" }, p.process_id),
          h("td", { class: "mono" }, p.command.join(" ")),
          h("td", {}, p.state),
          h("td", {}, p.exit_code ?? ""),
          h("td", {}, p.started_at ? `${age(p.started_at)} ago` : ""),
          h("td", {}, kill),
        ),
      );
    }
    if (procs.length === 0) list.appendChild(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No processes started through the API.")));
    if (focused) list.querySelector<HTMLElement>(`tr[data-id="${CSS.escape(focused)}"] button`)?.focus();
  };
  return [pane, poller(load)];
}

function activityPane(name: string): [HTMLElement, () => void] {
  const events = h("tbody");
  const commands = h("tbody");
  const pane = h(
    "section",
    { class: "activity", "aria-label": "Events and commands" },
    h("h2", {}, "Events"),
    h("div", { class: "scroll" }, h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ...["Time", "Event", "Reason"].map((c) => h("th", { scope: "col" }, c)))), events)),
    h("h2", {}, "Command log"),
    h("div", { class: "scroll" }, h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ...["Time", "Kind", "Command", "User", "Exit", "Duration"].map((c) => h("th", { scope: "col" }, c)))), commands)),
  );
  // Each table on its own: a server without the command log still shows events.
  const loadEvents = async () => {
    const ev = await json<{ events: Event[] }>(`${sandboxPath(name)}/events`, { scoped: true });
    clear(events);
    for (const e of [...ev.events].reverse()) {
      events.appendChild(h("tr", {}, h("td", {}, new Date(e.at).toLocaleString()), h("td", {}, e.kind), h("td", {}, e.reason ?? "")));
    }
  };
  const loadCommands = async () => {
    const cmd = await json<{ commands: Command[] }>(`${sandboxPath(name)}/commands`, { scoped: true });
    clear(commands);
    for (const c of [...cmd.commands].reverse()) {
      commands.appendChild(
        h("tr", {}, h("td", {}, new Date(c.at).toLocaleString()), h("td", {}, c.kind ?? ""), h("td", { class: "mono" }, c.argv.join(" ")), h("td", {}, c.user ?? ""), h("td", {}, c.exit_code ?? ""), h("td", {}, c.duration_ms !== undefined && c.duration_ms !== null ? `${c.duration_ms} ms` : "")),
      );
    }
  };
  const load = async () => {
    await Promise.allSettled([loadEvents(), loadCommands()]);
  };
  return [pane, poller(load)];
}

function rates(samples: Sample[], key: "net_rx_bytes" | "net_tx_bytes"): number[] {
  const out: number[] = [];
  for (let i = 1; i < samples.length; i++) {
    const prev = samples[i - 1]!;
    const next = samples[i]!;
    const dt = (Date.parse(next.at) - Date.parse(prev.at)) / 1000;
    const a = prev[key] ?? 0;
    const b = next[key] ?? 0;
    out.push(dt > 0 ? Math.max(0, b - a) / dt : 0);
  }
  return out;
}

function metricsPane(name: string): [HTMLElement, () => void] {
  const charts = h("div", { class: "charts" });
  const pane = h("section", { class: "metrics", "aria-label": "Metrics" }, charts);
  const load = async () => {
    const doc = await json<{ interval_seconds: number; samples: Sample[] }>(`${sandboxPath(name)}/metrics`, { scoped: true });
    const s = doc.samples;
    const last = s[s.length - 1];
    const memMax = last?.memory_limit_bytes ?? Math.max(1, ...s.map((x) => x.memory_bytes));
    const rx = rates(s, "net_rx_bytes");
    const tx = rates(s, "net_tx_bytes");
    clear(charts);
    charts.append(
      chart("CPU", s.map((x) => x.cpu_percent), Math.max(100, ...s.map((x) => x.cpu_percent)), last ? `${last.cpu_percent.toFixed(1)}%` : "—", "cpu"),
      chart("Memory", s.map((x) => x.memory_bytes), memMax, last ? `${formatBytes(last.memory_bytes)} of ${formatBytes(last.memory_limit_bytes)}` : "—", "mem"),
      chart("Disk", s.map((x) => x.disk_bytes ?? 0), Math.max(1, ...s.map((x) => x.disk_bytes ?? 0)), formatBytes(last?.disk_bytes), "disk"),
      chart("Network in", rx, Math.max(1, ...rx), `${formatBytes(rx[rx.length - 1] ?? 0)}/s`, "net"),
      chart("Network out", tx, Math.max(1, ...tx), `${formatBytes(tx[tx.length - 1] ?? 0)}/s`, "net"),
    );
  };
  return [pane, poller(load)];
}

type Tab = "terminal" | "files" | "processes" | "activity" | "metrics";
const TABS: [Tab, string][] = [
  ["terminal", "Terminal"],
  ["files", "Files"],
  ["processes", "Processes"],
  ["activity", "Events & commands"],
  ["metrics", "Metrics"],
];

export async function sandboxPage(main: HTMLElement, params: string[]): Promise<() => void> {
  const name = params[0] ?? "";
  const info = h("p", { class: "muted" });
  const stop = button("Stop", async () => {
    try {
      await call(`${sandboxPath(name)}/stop`, { method: "POST", scoped: true });
      toast(`Stopped ${name}`);
      void refresh();
    } catch (e) {
      toast(e instanceof ApiError ? e.message : "stop failed", "error");
    }
  });
  const del = button("Delete", async () => {
    if (del.dataset.armed !== "yes") {
      del.dataset.armed = "yes";
      del.textContent = "Really delete?";
      return;
    }
    try {
      await call(sandboxPath(name), { method: "DELETE", scoped: true });
      toast(`Deleted ${name}`);
      navigate("/console/app/sandboxes");
    } catch (e) {
      toast(e instanceof ApiError ? e.message : "delete failed", "error");
    }
  }, { class: "danger" });
  const tablist = h("div", { role: "tablist", class: "tabs", "aria-label": "Sandbox views" });
  const panel = h("div", { role: "tabpanel", class: "panel", id: "panel", tabindex: "0" });
  main.append(h("div", { class: "row head" }, h("h1", { class: "name" }, name), stop, del), info, tablist, panel);

  async function refresh(): Promise<void> {
    try {
      const r = await json<SandboxRow>(sandboxPath(name), { scoped: true });
      info.textContent = `${r.state} · ${r.runtime_class ?? r.class ?? ""} · created ${age(r.created_at)} ago · last active ${age(r.last_active_at)} ago`;
    } catch (e) {
      info.textContent = e instanceof ApiError ? `${e.message} (${e.code})` : "unknown";
    }
  }

  let stopPane: () => void = () => undefined;
  let terminal: TerminalView | null = null;
  const buttons = new Map<Tab, HTMLButtonElement>();

  function show(tab: Tab): void {
    stopPane();
    stopPane = () => undefined;
    for (const [t, b] of buttons) {
      b.setAttribute("aria-selected", String(t === tab));
      b.tabIndex = t === tab ? 0 : -1;
    }
    clear(panel);
    panel.setAttribute("aria-labelledby", `tab-${tab}`);
    if (tab === "terminal") {
      terminal ??= openTerminal(name, () => buttons.get("terminal")?.focus());
      panel.appendChild(terminal.element);
      return;
    }
    const [el, stopIt] =
      tab === "files" ? [filesPane(name), () => undefined] : tab === "processes" ? processesPane(name) : tab === "activity" ? activityPane(name) : metricsPane(name);
    panel.appendChild(el);
    stopPane = stopIt;
  }

  TABS.forEach(([tab, label], i) => {
    const b = button(label, () => show(tab), { role: "tab", id: `tab-${tab}`, "aria-controls": "panel" });
    b.addEventListener("keydown", (ev) => {
      const step = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
      if (!step) return;
      const next = TABS[(i + step + TABS.length) % TABS.length]![0];
      show(next);
      buttons.get(next)?.focus();
    });
    buttons.set(tab, b);
    tablist.appendChild(b);
  });
  await refresh();
  show("terminal");
  return () => {
    stopPane();
    terminal?.dispose();
  };
}
