// Client routes under /console/app/ (the server answers each with the app's page),
// moved between with the History API so links stay real links: they open in a
// new tab, and the keyboard and screen readers treat them as links.

export type Cleanup = () => void;
export type Page = (main: HTMLElement, params: string[]) => Cleanup | void | Promise<Cleanup | void>;

interface Route {
  pattern: RegExp;
  page: Page;
}

const routes: Route[] = [];
let cleanup: Cleanup | void = undefined;
let fallback: Page = () => undefined;

export function route(pattern: RegExp, page: Page): void {
  routes.push({ pattern, page });
}

export function otherwise(page: Page): void {
  fallback = page;
}

export function navigate(path: string, replace = false): void {
  if (replace) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  void render();
}

export async function render(): Promise<void> {
  if (cleanup) cleanup();
  cleanup = undefined;
  const main = document.getElementById("main") as HTMLElement;
  while (main.firstChild) main.removeChild(main.firstChild);
  const path = location.pathname;
  for (const r of routes) {
    const m = r.pattern.exec(path);
    if (m) {
      cleanup = await r.page(main, m.slice(1).map((p) => decodeURIComponent(p)));
      window.dispatchEvent(new CustomEvent("podbay:rendered"));
      return;
    }
  }
  cleanup = await fallback(main, []);
  window.dispatchEvent(new CustomEvent("podbay:rendered"));
}

/** Links inside the app navigate without a reload (plain clicks only). */
export function interceptLinks(): void {
  document.addEventListener("click", (ev) => {
    if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    const a = (ev.target as Element | null)?.closest?.("a");
    if (!a || a.target || a.hasAttribute("download")) return;
    const url = new URL(a.href, location.href);
    if (url.origin !== location.origin || !url.pathname.startsWith("/console/app/")) return;
    ev.preventDefault();
    navigate(url.pathname + url.search);
  });
  window.addEventListener("popstate", () => void render());
}
