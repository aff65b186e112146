// Operator: the nodes (one in `podbay serve`), their capacity and state; drain.
import { ApiError, enc, json } from "../api";
import { button, clear, formatBytes, h, toast } from "../dom";

interface Node {
  name: string;
  state?: string;
  endpoint?: string;
  sandboxes?: number;
  capacity?: Record<string, number | string | null> | number | null;
  cpus?: number | null;
  memory_bytes?: number | null;
  disk_free_bytes?: number | null;
  last_seen_at?: string | null;
}

function capacity(n: Node): string {
  const c = n.capacity;
  if (c === null || c === undefined) {
    const parts = [n.cpus ? `${n.cpus} CPUs` : "", n.memory_bytes ? formatBytes(n.memory_bytes) : "", n.disk_free_bytes ? `${formatBytes(n.disk_free_bytes)} disk free` : ""];
    return parts.filter(Boolean).join(", ") || "—";
  }
  if (typeof c === "number") return String(c);
  return Object.entries(c)
    .map(([k, v]) => `${k}: ${typeof v === "number" && /bytes/.test(k) ? formatBytes(v) : String(v)}`)
    .join(", ");
}

export async function nodesPage(main: HTMLElement): Promise<void> {
  const list = h("tbody");
  const head = h("tr");
  const note = h("p", { class: "muted" });
  main.append(h("h1", {}, "Nodes"), note, h("div", { class: "scroll" }, h("table", { class: "grid" }, h("thead", {}, head), list)));
  async function load(): Promise<void> {
    let doc: { cluster?: boolean; nodes: Node[] };
    try {
      doc = await json<{ cluster?: boolean; nodes: Node[] }>("/api/v1/nodes");
    } catch (e) {
      toast(e instanceof ApiError ? e.message : "could not list nodes", "error");
      return;
    }
    // `podbay serve` is its own one node: there is nowhere to drain it to
    // (the server answers 409 NOT_A_CLUSTER), so no Drain is offered.
    const cluster = doc.cluster !== false;
    note.textContent = cluster ? "" : "podbay serve runs every sandbox on this one node; draining needs a cluster (podbay control and nodes).";
    clear(head);
    for (const c of ["Node", "State", "Sandboxes", "Capacity", ...(cluster ? ["Actions"] : [])]) head.appendChild(h("th", { scope: "col" }, c));
    clear(list);
    for (const n of doc.nodes) {
      const cells = [h("th", { scope: "row" }, n.name), h("td", {}, n.state ?? "—"), h("td", {}, n.sandboxes ?? "—"), h("td", {}, capacity(n))];
      if (!cluster) {
        list.appendChild(h("tr", {}, ...cells));
        continue;
      }
      const drain = button("Drain", async () => {
        try {
          await json(`/api/v1/nodes/${enc(n.name)}/drain`, { method: "POST" });
          toast(`Draining ${n.name}`);
          await load();
        } catch (e) {
          toast(e instanceof ApiError ? `${e.message} (${e.code})` : "drain failed", "error");
        }
      }, { "aria-label": `Drain ${n.name}`, disabled: n.state === "draining" || n.state === "drained" });
      list.appendChild(h("tr", {}, ...cells, h("td", {}, drain)));
    }
  }
  await load();
}
