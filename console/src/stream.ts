// The live stream (server-sent events): `sandboxes` (the list) and `metrics`
// (the newest sample per sandbox). One EventSource per page that needs it;
// the browser reconnects on its own after a drop.
import type { Sample, SandboxRow } from "./api";
import { currentDeployment, current } from "./api";

export interface Handlers {
  sandboxes?: (rows: SandboxRow[]) => void;
  metrics?: (samples: Record<string, Sample>) => void;
}

function parse(data: string): unknown {
  try {
    return JSON.parse(data);
  } catch {
    return null;
  }
}

export function openStream(handlers: Handlers): () => void {
  const dep = current()?.scope === "operator" ? currentDeployment() : null;
  const url = dep ? `/console/stream?deployment=${encodeURIComponent(dep)}` : "/console/stream";
  const source = new EventSource(url);
  source.addEventListener("sandboxes", (ev) => {
    const doc = parse((ev as MessageEvent<string>).data) as { sandboxes?: unknown } | null;
    if (Array.isArray(doc?.sandboxes)) handlers.sandboxes?.(doc.sandboxes as SandboxRow[]);
  });
  source.addEventListener("metrics", (ev) => {
    const doc = parse((ev as MessageEvent<string>).data) as { samples?: unknown } | null;
    if (doc?.samples && typeof doc.samples === "object") handlers.metrics?.(doc.samples as Record<string, Sample>);
  });
  // The server's `error` event (the session ended) carries data; the
  // browser's own (a dropped connection, retried by itself) does not.
  source.addEventListener("error", (ev) => {
    const data = (ev as MessageEvent<string>).data;
    if (typeof data !== "string") return;
    source.close();
    window.dispatchEvent(new CustomEvent("podbay:signed-out"));
  });
  return () => source.close();
}
