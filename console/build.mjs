// Bundles the console into the Python package (src/podbay/console/static/):
// static/index.html, and static/assets/main.js + main.css (esbuild's CSS output
// holds every CSS file main.ts imports, xterm.js's included). The server serves
// static/ as is, so `pip install 'podbay[server]'` needs no node.
import { build } from "esbuild";
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "podbay", "console", "static");

await rm(out, { recursive: true, force: true });
await mkdir(join(out, "assets"), { recursive: true });
await build({
  entryPoints: [join(here, "src", "main.ts")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: false,
  legalComments: "linked",
  outdir: join(out, "assets"),
  entryNames: "[name]",
  logLevel: "warning",
});
await copyFile(join(here, "index.html"), join(out, "index.html"));
