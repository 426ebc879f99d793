// /jobs/<id>/: one job, live. Everything comes from the websocket /ws/jobs/<id>/ (it replays the
// job's metrics and events from the start, then streams new ones): the state header, four
// curves, the step table and the events list. The buttons POST to the REST actions. Estimated vs
// billed device-hours come from GET jobs/<id>/, read on load, on state changes and as steps arrive.
import { api, pageData } from "./api.js";
import { PhaseChart, StepChart } from "./charts.js";
import { el, num, showMessage, when } from "./dom.js";
import { live, showStatus } from "./live.js";

const page = pageData();
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const MAX_EVENTS = 500; // the list keeps the newest; the API has them all (GET jobs/<id>/events/)
const QUIET_KINDS = new Set(["usage", "timings"]); // one per call or step: too many to list

const stateBadge = document.getElementById("job-state");
const reason = document.getElementById("job-reason");
const stepNode = document.getElementById("job-step");
const actionError = document.getElementById("action-error");
const stepTable = document.getElementById("step-table");
const stepRows = document.getElementById("step-rows");
const eventList = document.getElementById("event-list");

const charts = [
  new StepChart(document.getElementById("chart-reward"), [
    { key: "reward_mean", label: "reward" },
    { key: "train_accuracy", label: "train accuracy" },
  ], { fraction: true }),
  new StepChart(document.getElementById("chart-eval"), [{ key: "eval_accuracy", label: "eval accuracy" }],
    { fraction: true }),
  new StepChart(document.getElementById("chart-loss"), [{ key: "loss", label: "loss" }]),
  new StepChart(document.getElementById("chart-kl"), [{ key: "kl", label: "KL" }]),
];
// GRPO's phases, bottom up (a tool-using task's waits on its tool within them are tool_stall)
const PHASES = ["generate", "reward", "logprobs", "train", "sync", "eval"];
const timings = new PhaseChart(document.getElementById("chart-timings"), PHASES);

// any other metric the job logs (grad norm, clip fraction, response length, ...), on demand
const picker = document.getElementById("metric-add");
const known = new Set(["reward_mean", "train_accuracy", "eval_accuracy", "loss", "kl"]);
const offered = new Set();

function offer(data) {
  const fresh = Object.keys(data).filter((key) => key !== "step" && typeof data[key] === "number"
    && !known.has(key) && !offered.has(key));
  for (const key of fresh.sort()) {
    offered.add(key);
    picker.append(el("option", { value: key }, key));
  }
}

picker.addEventListener("change", () => {
  const key = picker.value;
  picker.value = "";
  if (!key || known.has(key)) return;
  known.add(key);
  const figure = el("figure", { class: "chart", dataset: { metric: key, points: "0" } }, el("figcaption", {}, key));
  document.getElementById("more-charts").append(figure);
  const chart = new StepChart(figure, [{ key, label: key }]);
  charts.push(chart);
  for (const [step, data] of metricsByStep) chart.add(step, data);
});

// --- state and actions ---------------------------------------------------------------------------

function showState(job) {
  stateBadge.dataset.state = job.state;
  stateBadge.textContent = job.state;
  reason.textContent = job.state_reason ? `(${job.state_reason})` : "";
  if ("started_at" in job) document.getElementById("job-started").textContent = when(job.started_at);
  if ("finished_at" in job) document.getElementById("job-finished").textContent = when(job.finished_at);
  const buttons = {
    pause: !TERMINAL.has(job.state) && job.state !== "paused",
    resume: job.state === "paused",
    cancel: !TERMINAL.has(job.state),
  };
  for (const [action, enabled] of Object.entries(buttons)) {
    const button = document.getElementById(`action-${action}`);
    if (button) button.disabled = !enabled;
  }
}

for (const button of document.querySelectorAll("button[data-action]")) {
  button.addEventListener("click", async () => {
    showMessage(actionError, "");
    button.disabled = true;
    try {
      showState(await api(`jobs/${page.job}/${button.dataset.action}/`, { method: "POST" }));
    } catch (err) {
      showMessage(actionError, `Could not ${button.dataset.action}: ${err.message}`);
      actionError.dataset.status = String(err.status ?? "");
      button.disabled = false;
    }
  });
}

// --- estimated vs billed -----------------------------------------------------------------------

const COST_REFRESH_MS = 5000;
let costTimer = null;

function deviceHours(value) {
  return `${Number(value.toPrecision(3))} device-hours`;
}

function showCost(job) {
  const estimated = document.getElementById("job-estimated");
  const billed = document.getElementById("job-billed");
  if (job.estimate) {
    estimated.dataset.multiplexed = String(job.estimate.multiplexed_device_hours);
    estimated.dataset.dedicated = String(job.estimate.dedicated_device_hours);
    estimated.textContent = `${deviceHours(job.estimate.multiplexed_device_hours)} (dedicated: ${deviceHours(job.estimate.dedicated_device_hours)})`;
  } else {
    estimated.textContent = "none (submitted before estimates)";
  }
  const s = job.savings;
  if (s && s.billed_device_hours > 0) {
    billed.dataset.billed = String(s.billed_device_hours);
    const redone = s.redone_device_hours > 0 ? `; ${deviceHours(s.redone_device_hours)} redone after an engine fault, not billed` : "";
    billed.textContent = `${deviceHours(s.billed_device_hours)} (dedicated: ${deviceHours(s.counterfactual_device_hours)}${redone})`;
  }
}

/** Read the job's figures again, at most once per COST_REFRESH_MS. */
function refreshCost() {
  if (costTimer) return;
  costTimer = setTimeout(() => { costTimer = null; }, COST_REFRESH_MS);
  api(`jobs/${page.job}/`).then(showCost).catch(() => {}); // figures only: the live feed shows failures
}

// --- steps -------------------------------------------------------------------------------------

const rowsByStep = new Map();
const metricsByStep = new Map(); // step -> its metrics, for a chart added later

function addStep(step, data) {
  const cells = [
    el("th", { scope: "row" }, step),
    el("td", { class: "num" }, num(data.reward_mean)),
    el("td", { class: "num" }, num(data.train_accuracy)),
    el("td", { class: "num" }, num(data.eval_accuracy)),
    el("td", { class: "num" }, num(data.loss, 4)),
    el("td", { class: "num" }, num(data.kl, 4)),
    el("td", { class: "num" }, num(data.response_length, 1)),
  ];
  const existing = rowsByStep.get(step);
  if (existing) {
    existing.replaceChildren(...cells);
  } else {
    const row = el("tr", { dataset: { step } }, cells);
    // newest first: before the first row of a lower step
    const after = [...rowsByStep.keys()].filter((s) => s < step).sort((a, b) => b - a)[0];
    stepRows.insertBefore(row, after === undefined ? null : rowsByStep.get(after));
    rowsByStep.set(step, row);
  }
  stepTable.dataset.rows = String(rowsByStep.size);
  const last = Math.max(...rowsByStep.keys());
  stepNode.textContent = String(last);
  stepTable.dataset.lastStep = String(last);
  metricsByStep.set(step, data);
  offer(data);
  for (const chart of charts) chart.add(step, data);
}

// --- events ------------------------------------------------------------------------------------

function summary(kind, data) {
  if (kind === "log" && data && "message" in data) return String(data.message);
  if (kind === "state" && data) return [data.state, data.reason].filter(Boolean).join(": ");
  const text = JSON.stringify(data ?? {});
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

function addEvent(message) {
  if (QUIET_KINDS.has(message.kind)) return;
  eventList.prepend(
    el(
      "li",
      { dataset: { seq: message.seq, kind: message.kind } },
      el("time", {}, when(message.ts)),
      " ",
      el("span", { class: "kind" }, message.kind),
      " ",
      summary(message.kind, message.data),
    ),
  );
  while (eventList.children.length > MAX_EVENTS) eventList.lastElementChild.remove();
  eventList.dataset.count = String(eventList.children.length);
}

// --- the feed ----------------------------------------------------------------------------------

showState({ state: page.job_state, state_reason: "" });
refreshCost();
live(page.ws_path, {
  onStatus: showStatus(document.getElementById("live-status")),
  onMessage(message) {
    if (message.type === "job" && message.job) {
      showState(message.job);
      clearTimeout(costTimer); // a state change: read the figures now
      costTimer = null;
      refreshCost();
    } else if (message.type === "metrics" && typeof message.step === "number") {
      addStep(message.step, message.data || {});
      refreshCost(); // steps mean calls billed
    } else if (message.type === "event") {
      if (message.kind === "timings" && message.data && typeof message.data.step === "number") {
        timings.add(message.data.step, message.data);
      }
      addEvent(message);
    }
  },
});
