// Operator: deployments (create, new identity token or E2B key, delete) and
// the deployment the sandbox pages look at.
import { ApiError, chooseDeployment, currentDeployment, enc, json } from "../api";
import { button, clear, field, h, toast } from "../dom";
import { navigate } from "../router";

interface Deployment {
  name: string;
  created_at?: string;
  sandboxes?: number;
}

function secret(title: string, value: string): HTMLElement {
  const input = h("input", { type: "text", readonly: true, value, class: "secret", "aria-label": title });
  const copy = button("Copy", async () => {
    try {
      await navigator.clipboard.writeText(value);
      toast("Copied");
    } catch {
      input.select();
    }
  });
  return h("div", { class: "card reveal", role: "group", "aria-label": title }, h("p", {}, title, " (shown once):"), h("div", { class: "row" }, input, copy));
}

export async function deploymentsPage(main: HTMLElement): Promise<void> {
  const list = h("tbody");
  const revealed = h("div");
  const name = h("input", { type: "text", name: "name", required: true, autocomplete: "off" });
  const form = h("form", { class: "row inline-form" }, field("New deployment", name), h("button", { type: "submit", class: "primary" }, "Create"));
  main.append(
    h("h1", {}, "Deployments"),
    form,
    revealed,
    h("table", { class: "grid" }, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Name"), h("th", { scope: "col" }, "Sandboxes"), h("th", { scope: "col" }, "Actions"))), list),
  );

  const show = (title: string, value: string) => {
    clear(revealed);
    revealed.appendChild(secret(title, value));
  };

  async function load(): Promise<void> {
    let rows: Deployment[];
    try {
      const doc = await json<{ deployments: Deployment[] }>("/api/v1/deployments");
      rows = doc.deployments;
    } catch (e) {
      toast(e instanceof ApiError ? e.message : "could not list deployments", "error");
      return;
    }
    clear(list);
    for (const d of rows) {
      const del = button("Delete", () => {
        if (del.dataset.armed !== "yes") {
          del.dataset.armed = "yes";
          del.textContent = `Really delete ${d.name}?`;
          return;
        }
        void (async () => {
          try {
            await json(`/api/v1/deployments/${enc(d.name)}`, { method: "DELETE" });
            if (currentDeployment() === d.name) chooseDeployment(null);
            toast(`Deleted ${d.name}`);
            await load();
          } catch (e) {
            toast(e instanceof ApiError ? e.message : "delete failed", "error");
          }
        })();
      }, { class: "danger" });
      const mint = (kind: string | null) => async () => {
        try {
          const doc = await json<{ token?: string; key?: string }>(`/api/v1/deployments/${enc(d.name)}/token`, { method: "POST", body: kind ? { kind } : {} });
          show(kind ? `E2B API key for ${d.name}` : `Identity token for ${d.name}`, doc.token ?? doc.key ?? "");
        } catch (e) {
          toast(e instanceof ApiError ? e.message : "failed", "error");
        }
      };
      const open = button("Sandboxes", () => {
        chooseDeployment(d.name);
        navigate("/console/app/sandboxes");
      });
      list.appendChild(
        h(
          "tr",
          { class: currentDeployment() === d.name ? "chosen" : null },
          h("td", {}, d.name),
          h("td", {}, d.sandboxes ?? "—"),
          h("td", {}, h("div", { class: "actions" }, open, button("New token", mint(null)), button("New E2B key", mint("e2b")), del)),
        ),
      );
    }
    if (rows.length === 0) list.appendChild(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "No deployments yet.")));
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const doc = await json<{ name: string; token: string }>("/api/v1/deployments", { method: "POST", body: { name: name.value.trim() } });
      name.value = "";
      show(`Identity token for ${doc.name}`, doc.token);
      await load();
    } catch (e) {
      toast(e instanceof ApiError ? `${e.message} (${e.code})` : "create failed", "error");
    }
  });
  await load();
}
