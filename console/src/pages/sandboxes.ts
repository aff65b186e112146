// This deployment's sandboxes, live from the stream: state, class, template,
// age, node, CPU and memory sparklines, last activity; filter and search.
import { ApiError, current, currentDeployment, json, sandboxPath, type Sample, type SandboxRow, enc } from "../api";
import { sparkline } from "../charts";
import { age, clear, field, formatBytes, h, toast } from "../dom";
import { openStream } from "../stream";

/** Samples kept per sandbox for its sparklines (at 2 s: the last minute). */
const HISTORY = 30;

function labelList(labels: Record<string, string> | null | undefined): HTMLElement | null {
  const entries = Object.entries(labels ?? {});
  if (entries.length === 0) return null;
  return h("ul", { class: "labels", "aria-label": "labels" }, ...entries.map(([k, v]) => h("li", {}, `${k}=${v}`)));
}

export async function sandboxesPage(main: HTMLElement): Promise<() => void> {
  if (current()?.scope === "operator" && !currentDeployment()) {
    main.append(h("h1", {}, "Sandboxes"), h("p", {}, "Choose a deployment first: ", h("a", { href: "/console/app/deployments" }, "Deployments"), "."));
    return () => undefined;
  }
  const search = h("input", { type: "search", name: "q", autocomplete: "off", placeholder: "name or label" });
  const state = h("select", { name: "state" });
  for (const s of ["all", "running", "creating", "suspended", "stopped", "lost"]) state.appendChild(h("option", { value: s }, s));
  const body = h("tbody");
  const count = h("p", { class: "muted", role: "status" });
  main.append(
    h("h1", {}, "Sandboxes ", h("span", { class: "muted" }, currentDeployment() ?? "")),
    h("div", { class: "row filters" }, field("Search", search), field("State", state)),
    count,
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        { class: "grid sandboxes" },
        h(
          "thead",
          {},
          h("tr", {}, ...["Name", "State", "Class", "Template", "Age", "Node", "CPU", "Memory", "Last activity"].map((c) => h("th", { scope: "col" }, c))),
        ),
        body,
      ),
    ),
  );

  let rows: SandboxRow[] = [];
  const history = new Map<string, Sample[]>();

  function remember(name: string, samples: Sample[]): void {
    const list = history.get(name) ?? [];
    const newest = list[list.length - 1]?.at ?? "";
    for (const s of samples) if (s && typeof s.cpu_percent === "number" && s.at > newest) list.push(s);
    if (list.length > HISTORY) list.splice(0, list.length - HISTORY);
    history.set(name, list);
  }

  function draw(): void {
    const q = search.value.trim().toLowerCase();
    const want = state.value;
    const shown = rows.filter((r) => {
      if (want !== "all" && r.state !== want) return false;
      if (!q) return true;
      const labels = Object.entries(r.labels ?? {}).map(([k, v]) => `${k}=${v}`);
      return [r.name, ...labels].some((s) => s.toLowerCase().includes(q));
    });
    // Redrawn every sample: keep the keyboard focus on the row it was on.
    const focused = (document.activeElement as HTMLElement | null)?.closest?.("tr")?.dataset.name;
    clear(body);
    const now = Date.now();
    for (const r of shown) {
      const samples = history.get(r.name) ?? [];
      const last = samples[samples.length - 1];
      const limit = last?.memory_limit_bytes ?? Math.max(1, ...samples.map((s) => s.memory_bytes));
      const link = h("a", { href: `/console/app/sandboxes/${enc(r.name)}`, class: "name" }, r.name);
      body.appendChild(
        h(
          "tr",
          { "data-name": r.name },
          h("th", { scope: "row" }, link, labelList(r.labels)),
          h("td", { "data-label": "State" }, h("span", { class: `state ${/^[a-z]+$/.test(r.state) ? r.state : "unknown"}` }, r.state)),
          h("td", { "data-label": "Class" }, r.runtime_class ?? r.class ?? "—"),
          h("td", { "data-label": "Template" }, r.template ?? "—"),
          h("td", { "data-label": "Age" }, age(r.created_at, now)),
          h("td", { "data-label": "Node" }, r.node ?? "—"),
          h("td", { "data-label": "CPU" }, h("div", { class: "metric" }, sparkline([{ values: samples.map((s) => s.cpu_percent), className: "cpu" }], (s) => Math.max(100, ...s.values), `CPU ${last ? last.cpu_percent.toFixed(0) : "—"}%`), h("span", {}, last ? `${last.cpu_percent.toFixed(0)}%` : "—"))),
          h("td", { "data-label": "Memory" }, h("div", { class: "metric" }, sparkline([{ values: samples.map((s) => s.memory_bytes), className: "mem" }], () => limit, `memory ${formatBytes(last?.memory_bytes)}`), h("span", {}, formatBytes(last?.memory_bytes)))),
          h("td", { "data-label": "Last activity" }, r.last_active_at ? `${age(r.last_active_at, now)} ago` : "—"),
        ),
      );
    }
    if (focused !== undefined) {
      for (const tr of body.rows) if (tr.dataset.name === focused) tr.querySelector("a")?.focus();
    }
    count.textContent = `${shown.length} of ${rows.length} sandbox${rows.length === 1 ? "" : "es"}`;
  }

  search.addEventListener("input", draw);
  state.addEventListener("change", draw);
  try {
    rows = (await json<{ sandboxes: SandboxRow[] }>("/api/v1/sandboxes", { scoped: true })).sandboxes;
  } catch (e) {
    toast(e instanceof ApiError ? e.message : "could not list sandboxes", "error");
  }
  draw();
  // Samples: the stream's `metrics` event (the newest sample of each running
  // sandbox, at once and every period). Only while no such event has come
  // for two periods (a server without it, or the stream down) is each
  // running sandbox's /metrics asked for what is newer than the last seen.
  let period = 2000;
  let timer = 0;
  let stopped = false;
  let streamedAt = 0;
  async function pollMetrics(): Promise<void> {
    const running = rows.filter((r) => r.state === "running");
    await Promise.allSettled(
      running.map(async (r) => {
        const newest = history.get(r.name)?.at(-1)?.at;
        const query = newest ? `?since=${enc(newest)}` : "";
        const doc = await json<{ interval_seconds: number; samples: Sample[] }>(`${sandboxPath(r.name)}/metrics${query}`, { scoped: true });
        if (doc.interval_seconds > 0) period = Math.max(1000, doc.interval_seconds * 1000);
        remember(r.name, doc.samples);
      }),
    );
    if (running.length > 0) draw();
  }
  const tick = async () => {
    if (Date.now() - streamedAt > 2 * period) await pollMetrics();
    if (!stopped) timer = window.setTimeout(tick, period);
  };
  timer = window.setTimeout(tick, period);
  const close = openStream({
    sandboxes: (next) => {
      rows = next;
      draw();
    },
    metrics: (latest) => {
      streamedAt = Date.now();
      for (const [name, sample] of Object.entries(latest)) remember(name, [sample]);
      draw();
    },
  });
  return () => {
    stopped = true;
    window.clearTimeout(timer);
    close();
  };
}
