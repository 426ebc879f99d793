// /billing/: per job, billed device-hours on the shared cluster against the dedicated
// counterfactual (GET /api/v1/billing/savings/), the totals, a bar chart, and one month's summary
// (GET /api/v1/billing/summary/?month=YYYY-MM).
import { api } from "./api.js";
import { el, num, percent, showMessage } from "./dom.js";

const error = document.getElementById("billing-error");
const SVG = "http://www.w3.org/2000/svg";
const MAX_BARS = 20;

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

/** Paired horizontal bars (billed, dedicated) for the newest jobs. */
function drawBars(jobs) {
  const figure = document.getElementById("savings-chart");
  const shown = jobs.filter((j) => j.counterfactual_device_hours > 0 || j.billed_device_hours > 0).slice(0, MAX_BARS);
  figure.dataset.bars = String(shown.length);
  figure.querySelector("svg")?.remove();
  if (!shown.length) return;
  const top = Math.max(...shown.map((j) => Math.max(j.billed_device_hours, j.counterfactual_device_hours)));
  const labelW = 160;
  const width = Math.max(420, figure.clientWidth);
  const barW = width - labelW - 90;
  const rowH = 30;
  const root = svg("svg", { width, height: shown.length * rowH, role: "img",
    "aria-label": "Billed against dedicated device-hours per job; the table below has the figures" });
  shown.forEach((job, i) => {
    const y = i * rowH;
    const label = `#${job.job} ${job.name || ""}`.trim();
    root.append(svg("text", { x: labelW - 6, y: y + 18, "text-anchor": "end", class: "bar-label" },
      label.length > 22 ? `${label.slice(0, 21)}…` : label));
    const dedicated = (job.counterfactual_device_hours / top) * barW;
    const billed = (job.billed_device_hours / top) * barW;
    root.append(svg("rect", { x: labelW, y: y + 4, width: Math.max(1, dedicated), height: 10, class: "bar-dedicated" }));
    root.append(svg("rect", { x: labelW, y: y + 15, width: Math.max(1, billed), height: 10, class: "bar-billed" }));
    root.append(svg("text", { x: labelW + Math.max(dedicated, billed) + 6, y: y + 18, class: "bar-value" },
      percent(job.savings)));
  });
  figure.append(root);
}

async function loadSavings() {
  const report = await api("billing/savings/");
  const totals = report.totals || {};
  document.getElementById("total-jobs").textContent = String(totals.jobs ?? 0);
  document.getElementById("total-billed").textContent = `${num(totals.billed_device_hours)} device-h`;
  document.getElementById("total-dedicated").textContent = `${num(totals.counterfactual_device_hours)} device-h`;
  document.getElementById("total-savings").textContent = percent(totals.savings);
  document.getElementById("savings-rows").replaceChildren(...report.jobs.map((job) =>
    el("tr", { dataset: { job: job.job } },
      el("td", {}, el("a", { href: `/jobs/${job.job}/` }, `#${job.job}`)),
      el("td", {}, job.name || "(unnamed)"),
      el("td", {}, el("span", { class: "badge", dataset: { state: job.state } }, job.state)),
      el("td", { class: "num" }, num(job.estimated_device_hours)),
      el("td", { class: "num" }, num(job.billed_device_hours)),
      el("td", { class: "num" }, num(job.counterfactual_device_hours)),
      el("td", { class: "num" }, percent(job.savings)))));
  document.getElementById("savings-table").dataset.loaded = "true";
  drawBars(report.jobs);
}

async function loadMonth(month) {
  const summary = await api("billing/summary/", { query: { month } });
  document.getElementById("month-input").value = summary.month;
  document.getElementById("month-csv").href = `/api/v1/billing/summary/?format=csv&month=${encodeURIComponent(summary.month)}`;
  document.getElementById("month-total").textContent =
    `${summary.month}: ${num(summary.device_hours)} device-hours in ${summary.calls} calls.`;
  document.getElementById("month-rows").replaceChildren(...summary.jobs.map((job) =>
    el("tr", {},
      el("td", {}, el("a", { href: `/jobs/${job.job}/` }, `#${job.job}`)),
      el("td", {}, job.name || "(unnamed)"),
      el("td", { class: "num" }, num(job.device_hours)),
      el("td", { class: "num" }, job.calls))));
}

document.getElementById("month-form").addEventListener("submit", (event) => {
  event.preventDefault();
  showMessage(error, "");
  loadMonth(document.getElementById("month-input").value)
    .catch((err) => showMessage(error, `Could not load the month: ${err.message}`));
});

Promise.all([loadSavings(), loadMonth("")]).catch((err) => showMessage(error, `Could not load billing: ${err.message}`));
