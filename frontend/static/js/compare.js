// /compare/?jobs=3,5: the runs' metrics (GET /api/v1/jobs/{id}/metrics/) overlaid, one chart a
// metric and one curve a run; the charts start with the reward, the held-out accuracy, the loss and
// the KL the runs have, and any other metric they logged can be added (phase timings included).
import { listAll, pageData } from "./api.js";
import { StepChart } from "./charts.js";
import { el, showMessage } from "./dom.js";

const data = pageData();
const holder = document.getElementById("compare-charts");
const picker = document.getElementById("metric-add");
const FIRST = ["reward_mean", "eval_accuracy", "loss", "kl"];
const FRACTIONS = new Set(["reward_mean", "train_accuracy", "eval_accuracy"]);
const byStep = new Map(); // step -> {run<id>: {metric: value}}
const shown = new Set();

function numbers(row, prefix = "", into = {}) {
  for (const [key, value] of Object.entries(row)) {
    if (key === "step" && !prefix) continue;
    if (typeof value === "number") into[prefix + key] = value;
    else if (value && typeof value === "object" && !Array.isArray(value)) numbers(value, `${prefix}${key}/`, into);
  }
  return into;
}

function chart(metric) {
  if (shown.has(metric)) return;
  shown.add(metric);
  const figure = el("figure", { class: "chart", dataset: { metric } }, el("figcaption", {}, metric));
  holder.append(figure);
  const series = data.runs.map((run) => ({ key: `run${run.id}`, label: `#${run.id} ${run.name}` }));
  const drawn = new StepChart(figure, series, { fraction: FRACTIONS.has(metric) });
  for (const [step, runs] of [...byStep.entries()].sort((a, b) => a[0] - b[0])) {
    const row = {};
    for (const [run, values] of Object.entries(runs)) if (metric in values) row[run] = values[metric];
    drawn.add(step, row);
  }
  for (const run of data.runs) {
    const has = [...byStep.values()].some((runs) => metric in (runs[`run${run.id}`] || {}));
    figure.dataset[`run${run.id}`] = has ? "drawn" : "none";
  }
}

async function load() {
  const keys = new Set();
  const all = await Promise.all(data.runs.map((run) => listAll(`jobs/${run.id}/metrics/`, {}, 100)));
  data.runs.forEach((run, i) => {
    for (const row of all[i]) {
      const values = numbers(row.data);
      Object.keys(values).forEach((key) => keys.add(key));
      const at = byStep.get(row.step) || {};
      at[`run${run.id}`] = values;
      byStep.set(row.step, at);
    }
  });
  for (const metric of FIRST) if (keys.has(metric)) chart(metric);
  picker.append(...[...keys].sort().map((key) => el("option", { value: key }, key)));
  holder.dataset.loaded = "true";
}

picker.addEventListener("change", () => {
  if (picker.value) chart(picker.value);
  picker.value = "";
});
if (!data.error) load().catch((err) => showMessage(document.getElementById("metrics-error"), `Could not load the metrics: ${err.message}`));
