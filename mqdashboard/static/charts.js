// mqdashboard's live charts: polls /api/series every sample interval and redraws each chart
// as SVG in place (no page reload, no library). Names come from the cluster and are hostile:
// they are only ever set with textContent, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#1098ad", "#e67700", "#5c940d"];
const MAX_LINES = COLORS.length;  // the busiest series of a chart, by their last value
const W = 600, H = 220, LEFT = 56, RIGHT = 10, TOP = 10, BOTTOM = 24;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function clock(ms) {
  return new Date(ms).toISOString().substring(11, 19);
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function busiest(series) {
  const last = (pts) => (pts.length ? pts[pts.length - 1][1] : 0);
  return Object.entries(series)
    .filter(([, pts]) => pts.length > 0)
    .sort((a, b) => last(b[1]) - last(a[1]) || (a[0] < b[0] ? -1 : 1))
    .slice(0, MAX_LINES);
}

function draw(figure, series) {
  for (const old of figure.querySelectorAll("svg, .legend, .nodata")) old.remove();
  const lines = busiest(series || {});
  if (!lines.length) {
    const p = document.createElement("p");
    p.className = "nodata";
    p.textContent = "No data yet (needs two samples).";
    figure.appendChild(p);
    return;
  }
  let t0 = Infinity, t1 = -Infinity, vmax = 0;
  for (const [, pts] of lines) for (const [t, v] of pts) {
    t0 = Math.min(t0, t); t1 = Math.max(t1, t); vmax = Math.max(vmax, v);
  }
  if (t1 <= t0) t1 = t0 + 1;
  const ymax = niceMax(vmax);
  const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, figure);
  for (const f of [0, 0.5, 1]) {
    el("line", { x1: LEFT, x2: W - RIGHT, y1: y(f * ymax), y2: y(f * ymax), stroke: "#e4e7ee" }, svg);
    const label = el("text", { x: LEFT - 6, y: y(f * ymax) + 4, "text-anchor": "end", "font-size": 11, fill: "#6b7385" }, svg);
    label.textContent = (f * ymax).toLocaleString(undefined, { maximumFractionDigits: 1 });
  }
  for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
    const label = el("text", { x: x(t), y: H - 6, "text-anchor": anchor, "font-size": 11, fill: "#6b7385" }, svg);
    label.textContent = clock(t) + " UTC";
  }
  const legend = document.createElement("div");
  legend.className = "legend";
  lines.forEach(([name, pts], i) => {
    const points = pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    el("polyline", { points, fill: "none", stroke: COLORS[i], "stroke-width": 2 }, svg);
    const item = document.createElement("span");
    item.style.color = COLORS[i];
    item.textContent = `${name}: ${pts[pts.length - 1][1].toLocaleString(undefined, { maximumFractionDigits: 1 })}`;
    legend.appendChild(item);
  });
  figure.appendChild(legend);
}

async function refresh(root, status) {
  try {
    const resp = await fetch("/api/series", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const data = await resp.json();
    for (const figure of root.querySelectorAll("figure[data-series]")) {
      draw(figure, data[figure.dataset.series]);
    }
    const problems = (data.errors || []).join("; ");
    status.textContent = `Updated ${clock(Date.now())} UTC, sample ${data.samples}.` +
      (problems ? ` Sampling errors: ${problems}` : "");
    root.dataset.samples = String(data.samples);
  } catch (err) {
    status.textContent = `Could not update: ${err.message}`;
  }
}

const root = document.getElementById("charts");
if (root) {
  const status = document.getElementById("status");
  const every = Math.max(200, Number(root.dataset.intervalMs) || 2000);
  refresh(root, status);
  setInterval(() => refresh(root, status), every);
}
