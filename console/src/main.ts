import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { current, loadSession, signOut } from "./api";
import { routeStyleElementsToConstructedSheets } from "./cspstyle";
import { button, clear, h } from "./dom";
import { deploymentsPage } from "./pages/deployments";
import { nodesPage } from "./pages/nodes";
import { sandboxPage } from "./pages/sandbox";
import { sandboxesPage } from "./pages/sandboxes";
import { signinPage } from "./pages/signin";
import { interceptLinks, navigate, otherwise, render, route, type Page } from "./router";

routeStyleElementsToConstructedSheets();

/** A page that needs a session: without one, the sign-in page. */
function signedIn(page: Page, operatorOnly = false): Page {
  return (main, params) => {
    const s = current();
    if (!s) {
      navigate("/console/app/signin", true);
      return;
    }
    if (operatorOnly && s.scope !== "operator") {
      main.append(h("h1", {}, "Not available"), h("p", {}, "This page is for operators."));
      return;
    }
    return page(main, params);
  };
}

function drawNav(): void {
  const nav = document.getElementById("nav") as HTMLElement;
  const who = document.getElementById("who") as HTMLElement;
  clear(nav);
  clear(who);
  const s = current();
  if (!s) return;
  const links: [string, string][] = [["/console/app/sandboxes", "Sandboxes"]];
  if (s.scope === "operator") links.unshift(["/console/app/deployments", "Deployments"]), links.push(["/console/app/nodes", "Nodes"]);
  for (const [href, label] of links) {
    const a = h("a", { href }, label);
    if (location.pathname.startsWith(href)) a.setAttribute("aria-current", "page");
    nav.appendChild(a);
  }
  who.append(
    s.scope === "operator" ? "operator" : `deployment ${s.deployment ?? ""}`,
    button("Sign out", async () => {
      await signOut().catch(() => undefined);
      drawNav();
      navigate("/console/app/signin", true);
    }),
  );
}

route(/^\/console\/app\/signin\/?$/, signinPage);
route(/^\/console\/app\/deployments\/?$/, signedIn(deploymentsPage, true));
route(/^\/console\/app\/nodes\/?$/, signedIn(nodesPage, true));
route(/^\/console\/app\/sandboxes\/?$/, signedIn(sandboxesPage));
route(/^\/console\/app\/sandboxes\/([^/]+)\/?$/, signedIn(sandboxPage));
otherwise(() => navigate(current() ? "/console/app/sandboxes" : "/console/app/signin", true));

window.addEventListener("podbay:rendered", drawNav);
window.addEventListener("podbay:signed-out", () => navigate("/console/app/signin", true));

async function start(): Promise<void> {
  interceptLinks();
  await loadSession();
  await render();
  document.documentElement.dataset.ready = "true";
  // Load to interactive, from navigation start (bench/console.py reads it).
  performance.mark("podbay:ready");
}

void start();
