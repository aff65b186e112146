// The file browser: list a directory, open a small text file to view and
// edit, upload, download. Names and contents are sandbox data: they go into
// text nodes and a <textarea>'s value, and downloads are blobs saved with a
// `download` attribute, never rendered in the console's origin.
import { ApiError, call, dataPath, enc, json } from "../api";
import { button, clear, field, formatBytes, h, toast } from "../dom";
import { sha256Hex } from "../sha256";

interface Entry {
  name: string;
  path: string;
  type: string;
  size: number;
  mtime: string;
}

/** Larger files are downloaded, not opened in the editor. */
const EDIT_LIMIT = 1024 * 1024;

function parent(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const i = trimmed.lastIndexOf("/");
  return i <= 0 ? "/" : trimmed.slice(0, i);
}

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

export function filesPane(name: string): HTMLElement {
  const base = dataPath(name);
  const where = h("input", { type: "text", name: "path", value: "/workspace", autocomplete: "off", spellcheck: "false" });
  const goForm = h("form", { class: "row inline-form" }, field("Directory", where), h("button", { type: "submit" }, "Open"));
  const upload = h("input", { type: "file", name: "upload", multiple: true });
  const list = h("tbody");
  const editor = h("div", { class: "editor" });
  const pane = h(
    "section",
    { class: "files", "aria-label": "Files" },
    goForm,
    h("div", { class: "row" }, field("Upload to this directory", upload)),
    h("div", { class: "scroll" }, h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ...["Name", "Type", "Size", "Modified", "Actions"].map((c) => h("th", { scope: "col" }, c)))), list)),
    editor,
  );
  let dir = "/workspace";

  async function download(entry: Entry): Promise<void> {
    try {
      const res = await call(`${base}/v1/files?path=${enc(entry.path)}`, { scoped: true });
      const blob = new Blob([await res.arrayBuffer()], { type: "application/octet-stream" });
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: entry.name, class: "hidden" });
      document.body.appendChild(a);
      a.click();
      a.remove();
      window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      toast(e instanceof ApiError ? e.message : "download failed", "error");
    }
  }

  async function write(path: string, data: ArrayBuffer): Promise<void> {
    const digest = await sha256Hex(data);
    await call(`${base}/v1/files?path=${enc(path)}`, {
      method: "PUT",
      raw: data,
      scoped: true,
      headers: { "Content-Type": "application/octet-stream", "X-Podbay-Sha256": digest },
    });
  }

  async function open(entry: Entry): Promise<void> {
    clear(editor);
    if (entry.size > EDIT_LIMIT) {
      editor.append(h("p", {}, `${entry.name} is ${formatBytes(entry.size)}: download it instead.`));
      return;
    }
    let text: string;
    try {
      const res = await call(`${base}/v1/files?path=${enc(entry.path)}`, { scoped: true });
      text = new TextDecoder("utf-8", { fatal: true }).decode(await res.arrayBuffer());
    } catch (e) {
      editor.append(h("p", {}, e instanceof ApiError ? e.message : `${entry.name} is not UTF-8 text: download it instead.`));
      return;
    }
    const area = h("textarea", { name: "content", rows: 16, spellcheck: "false", class: "mono" });
    area.value = text;
    const save = button("Save", async () => {
      try {
        await write(entry.path, new TextEncoder().encode(area.value).buffer as ArrayBuffer);
        toast(`Saved ${entry.path}`);
        await load();
      } catch (e) {
        toast(e instanceof ApiError ? e.message : "save failed", "error");
      }
    }, { class: "primary" });
    editor.append(h("h3", {}, entry.path), field("Contents", area), h("div", { class: "row" }, save, button("Close", () => clear(editor))));
    area.focus();
  }

  async function load(): Promise<void> {
    let entries: Entry[];
    try {
      entries = (await json<{ path: string; entries: Entry[] }>(`${base}/v1/files/list?path=${enc(dir)}`, { scoped: true })).entries;
    } catch (e) {
      toast(e instanceof ApiError ? `${e.message} (${e.code})` : "could not list", "error");
      return;
    }
    clear(list);
    if (dir !== "/") {
      list.appendChild(h("tr", {}, h("td", {}, button("..", () => go(parent(dir)), { "aria-label": "Parent directory" })), h("td", {}, "directory"), h("td"), h("td"), h("td")));
    }
    for (const e of entries) {
      const isDir = e.type === "directory" || e.type === "dir";
      const nameCell = isDir ? button(`${e.name}/`, () => go(e.path || join(dir, e.name))) : button(e.name, () => void open(e), { class: "link" });
      list.appendChild(
        h(
          "tr",
          { "data-name": e.name },
          h("td", {}, nameCell),
          h("td", {}, e.type),
          h("td", {}, isDir ? "" : formatBytes(e.size)),
          h("td", {}, e.mtime ? new Date(e.mtime).toLocaleString() : ""),
          h("td", {}, isDir ? "" : button("Download", () => void download(e), { "aria-label": `Download ${e.name}` })),
        ),
      );
    }
  }

  function go(path: string): void {
    dir = path || "/";
    where.value = dir;
    clear(editor);
    void load();
  }

  goForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    go(where.value.trim());
  });
  upload.addEventListener("change", async () => {
    for (const file of Array.from(upload.files ?? [])) {
      try {
        await write(join(dir, file.name), await file.arrayBuffer());
        toast(`Uploaded ${file.name}`);
      } catch (e) {
        toast(e instanceof ApiError ? `${file.name}: ${e.message}` : `${file.name}: upload failed`, "error");
      }
    }
    upload.value = "";
    await load();
  });
  void load();
  return pane;
}
