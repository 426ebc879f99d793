// /cluster/: one row per WPG (worker-process group) with a block per call of a job over the last
// ten minutes, a legend of the jobs, utilisation per WPG and the active jobs.
// The snapshot is GET /api/v1/cluster/?window=600 (refreshed every 30 s); new calls arrive live on
// /ws/cluster/ as {"type": "usage", "seq", "interval": {...}}.
import { api, pageData } from "./api.js";
import { el, percent, showMessage } from "./dom.js";
import { live, showStatus } from "./live.js";

const page = pageData();
const windowSelect = document.getElementById("window-select");
// Seconds shown: the window select's (a choice made before this module ran counts too).
let WINDOW = Number(windowSelect.value) || page.window || 600;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f5fbf", "#c2410c", "#15803d", "#7e22ce", "#b45309", "#0e7490", "#be185d", "#4d7c0f"];
const OTHER = "#9ca3af";
const LABEL_W = 120;
const ROW_H = 26;
const AXIS_H = 22;

const timeline = document.getElementById("timeline");
const legend = document.getElementById("timeline-legend");
const error = document.getElementById("cluster-error");

const intervals = new Map(); // seq -> interval
let utilisation = [];
let clockSkew = 0; // server time - browser time, seconds

const now = () => Date.now() / 1000 + clockSkew;

/** What a block belongs to: one of the organization's jobs (or any job, for staff), or "other". */
function owner(interval) {
  if (interval.job == null) return { key: "other", label: "other organization", color: OTHER };
  const label = `#${interval.job} ${interval.name || ""}`.trim();
  const shown = interval.own ? label : `${label} (${interval.organization || "other organization"})`;
  return { key: `job:${interval.job}`, label: shown, job: interval.job, own: interval.own };
}

/** "now", "−45 s", "−1:45" (minutes:seconds, for ticks finer than a minute) or "−5 min". */
function tickLabel(ago, step) {
  if (ago === 0) return "now";
  if (ago < 60) return `−${ago} s`;
  if (step < 60) return `−${Math.floor(ago / 60)}:${String(ago % 60).padStart(2, "0")}`;
  return `−${ago / 60} min`;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function draw() {
  const until = now();
  const since = until - WINDOW;
  for (const [seq, interval] of intervals) if (interval.end < since) intervals.delete(seq);
  const wpgs = new Set(utilisation.map((u) => String(u.wpg)));
  for (const interval of intervals.values()) wpgs.add(String(interval.wpg));
  const rows = [...wpgs].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  timeline.dataset.intervals = String(intervals.size);
  timeline.dataset.window = String(WINDOW);
  timeline.dataset.wpgs = String(rows.length);
  if (!rows.length) {
    timeline.replaceChildren(el("p", { class: "muted", id: "timeline-empty" }, "No device use in the window."));
    legend.replaceChildren();
    return;
  }
  const width = Math.max(480, timeline.clientWidth);
  const plotW = width - LABEL_W - 8;
  const height = rows.length * ROW_H + AXIS_H;
  const x = (t) => LABEL_W + ((Math.min(Math.max(t, since), until) - since) / WINDOW) * plotW;
  const root = svg("svg", { width, height, role: "img", "aria-labelledby": "timeline-title" });
  root.append(svg("title", { id: "timeline-title" },
    `Device use of ${rows.length} WPGs over the last ${Math.round(WINDOW / 60)} minutes`));

  rows.forEach((wpg, i) => {
    const y = i * ROW_H;
    root.append(svg("rect", { x: LABEL_W, y: y + 2, width: plotW, height: ROW_H - 4, class: "lane" }));
    root.append(svg("text", { x: LABEL_W - 6, y: y + ROW_H / 2 + 4, "text-anchor": "end", class: "lane-label" },
      /^\d+$/.test(wpg) ? `WPG ${wpg}` : wpg));
  });
  const colors = new Map();
  const legendEntries = new Map();
  for (const interval of intervals.values()) {
    const row = rows.indexOf(String(interval.wpg));
    if (row < 0 || interval.start > until) continue;
    const who = owner(interval);
    if (!colors.has(who.key)) colors.set(who.key, who.color || PALETTE[colors.size % PALETTE.length]);
    legendEntries.set(who.key, who);
    const x0 = x(interval.start);
    const rect = svg("rect", {
      x: x0, y: row * ROW_H + 4, width: Math.max(1, x(interval.end) - x0), height: ROW_H - 8,
      fill: colors.get(who.key), "data-job": interval.job ?? "other", "data-wpg": interval.wpg,
    });
    const seconds = (interval.end - interval.start).toFixed(1);
    rect.append(svg("title", {}, `${who.label}: ${interval.fn || "call"} (${interval.role || ""}), ` +
      `${interval.devices} devices, ${seconds} s`));
    root.append(rect);
  }
  // the time axis: about ten ticks at a round step, labelled in time ago
  const axisY = rows.length * ROW_H;
  const step = [10, 15, 30, 60, 120, 300, 600, 900].find((s) => WINDOW / s <= 10) || 900;
  for (let ago = 0; ago <= WINDOW; ago += step) {
    const tx = x(until - ago);
    root.append(svg("line", { x1: tx, x2: tx, y1: 0, y2: axisY + 4, class: "tick" }));
    const anchor = ago === 0 ? "end" : ago === WINDOW ? "start" : "middle";
    root.append(svg("text", { x: tx, y: axisY + 16, "text-anchor": anchor, class: "tick-label" },
      tickLabel(ago, step)));
  }
  timeline.replaceChildren(root);

  legend.replaceChildren(...[...legendEntries.values()].map((who) => {
    const label = who.own ? el("a", { href: `/jobs/${who.job}/` }, who.label) : who.label;
    return el("li", { dataset: { key: who.key } },
      el("span", { class: "swatch", style: `background:${colors.get(who.key)}`, "aria-hidden": "true" }), " ", label);
  }));
}

function showUtilisation() {
  document.getElementById("utilisation-rows").replaceChildren(...utilisation.map((u) =>
    el("tr", { dataset: { wpg: u.wpg } },
      el("th", { scope: "row" }, String(u.wpg)),
      el("td", { class: "num" }, u.devices ?? "–"),
      el("td", { class: "num" }, el("meter", { min: 0, max: 1, value: u.busy_fraction ?? 0, "aria-hidden": "true" }),
        " ", percent(u.busy_fraction)))));
}

function showJobs(snapshot) {
  document.getElementById("active-count").textContent = String(snapshot.active_jobs ?? 0);
  document.getElementById("reserved-devices").textContent = String(snapshot.reserved_devices ?? 0);
  document.getElementById("active-rows").replaceChildren(...(snapshot.jobs || []).map((job) => {
    const name = job.job == null ? "other organization" : `#${job.job} ${job.name || ""}`;
    return el("tr", { dataset: { own: String(Boolean(job.own)) } },
      el("td", {}, job.own ? el("a", { href: `/jobs/${job.job}/` }, name) : name),
      el("td", {}, job.organization ?? "other organization"),
      el("td", {}, el("span", { class: "badge", dataset: { state: job.state } }, job.state)),
      el("td", { class: "num" }, job.reserved_devices));
  }));
}

async function refresh() {
  try {
    const snapshot = await api("cluster/", { query: { window: WINDOW } });
    const span = snapshot.timeline || {};
    if (typeof span.until === "number") clockSkew = span.until - Date.now() / 1000;
    for (const interval of span.intervals || []) intervals.set(interval.seq, interval);
    utilisation = snapshot.utilisation || [];
    showJobs(snapshot);
    showUtilisation();
    showMessage(error, "");
    draw();
  } catch (err) {
    showMessage(error, `Could not load the cluster: ${err.message}`);
  }
}

windowSelect.addEventListener("change", (event) => {
  WINDOW = Number(event.target.value);
  const url = new URL(window.location.href);
  url.searchParams.set("window", String(WINDOW));
  window.history.replaceState(null, "", url);
  refresh();
});

await refresh();
setInterval(refresh, 30000);
setInterval(draw, 2000); // the window slides
let drawnWidth = timeline.clientWidth;
new ResizeObserver(() => {
  if (timeline.clientWidth !== drawnWidth) {
    drawnWidth = timeline.clientWidth;
    draw();
  }
}).observe(timeline);
live("/ws/cluster/", {
  onStatus: showStatus(document.getElementById("cluster-live")),
  onMessage(message) {
    if (message.type === "usage" && message.interval) {
      intervals.set(message.seq ?? message.interval.seq, message.interval);
      draw();
    }
  },
});
