// Plain SVG charts: a polyline per series, its points set as an attribute
// (numbers we computed, never strings from the server).
import { svg } from "./dom";

export interface Series {
  values: number[];
  className: string;
}

/** Points of a line through `values` scaled into width×height (0 at the bottom). */
export function points(values: number[], width: number, height: number, max: number): string {
  if (values.length === 0) return "";
  const top = max > 0 ? max : 1;
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  return values
    .map((v, i) => {
      const y = height - (Math.max(0, Math.min(v, top)) / top) * height;
      return `${(i * step).toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
}

/** A small inline chart for table rows. */
export function sparkline(series: Series[], max: (s: Series) => number, label: string): SVGSVGElement {
  const el = svg("svg", { class: "spark", viewBox: "0 0 100 24", preserveAspectRatio: "none", role: "img", "aria-label": label });
  for (const s of series) {
    el.appendChild(svg("polyline", { class: s.className, points: points(s.values, 100, 24, max(s)) }));
  }
  return el;
}

/** A larger chart with a title and the newest value. */
export function chart(title: string, values: number[], max: number, latest: string, className: string): HTMLElement {
  const figure = document.createElement("figure");
  figure.className = "chart";
  const caption = document.createElement("figcaption");
  const name = document.createElement("span");
  name.textContent = title;
  const value = document.createElement("span");
  value.className = "value";
  value.textContent = latest;
  caption.append(name, value);
  const el = svg("svg", { viewBox: "0 0 300 80", preserveAspectRatio: "none", role: "img", "aria-label": `${title}: ${latest}` });
  el.appendChild(svg("line", { class: "axis", x1: 0, y1: 80, x2: 300, y2: 80 }));
  el.appendChild(svg("polyline", { class: className, points: points(values, 300, 80, max), "data-samples": values.length }));
  figure.append(caption, el);
  return figure;
}
