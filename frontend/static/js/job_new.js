// /jobs/new/: the submit form. Builds the job from the form (an input named "spec.grpo.lr" is
// spec.grpo.lr of the body), POSTs it to /api/v1/jobs/ and shows the server's field errors beside
// their fields (the API names them the same way) and anything else above the form. The estimate
// (POST /api/v1/jobs/estimate/, same body) follows the form as it changes, debounced, and on the
// Estimate button; its figures go in #estimate (text, and data-dedicated / data-multiplexed).
import { api, listAll } from "./api.js";
import { el, showMessage } from "./dom.js";

const form = document.getElementById("job-form");
const general = document.getElementById("form-error");
const task = document.getElementById("f-task");
const dataset = document.getElementById("f-dataset");
const datasetField = document.getElementById("dataset-field");
const model = document.getElementById("f-model");
const tools = document.getElementById("tools-fields");
const submit = document.getElementById("submit-job");
const estimateOut = document.getElementById("estimate");
const estimateButton = document.getElementById("estimate-job");
const ESTIMATE_DELAY_MS = 400;

/** Show the dataset picker for task "dataset" and the calculator's settings for "arith-tools";
 * disabled controls are left out of the job. */
function followTask() {
  const isDataset = task.value === "dataset";
  datasetField.hidden = !isDataset;
  dataset.disabled = !isDataset;
  tools.hidden = tools.disabled = task.value !== "arith-tools";
}

async function loadChoices() {
  const [models, datasets] = await Promise.allSettled([api("models/"), listAll("datasets/")]);
  if (models.status === "fulfilled") {
    for (const m of models.value) {
      model.append(el("option", { value: m.name }, m.builtin ? `${m.name} (preset)` : m.name));
    }
  }
  dataset.replaceChildren();
  if (datasets.status === "fulfilled" && datasets.value.length) {
    for (const d of datasets.value) {
      dataset.append(el("option", { value: d.id }, `${d.name} (${d.problems} problems)`));
    }
  } else {
    dataset.append(el("option", { value: "" }, "No datasets in this organization"));
  }
  form.dataset.ready = "true";
}

function value(input) {
  const raw = input.type === "checkbox" ? input.checked : input.value.trim();
  if (raw === "") return undefined; // left out: the server's default applies
  switch (input.dataset.type) {
    case "int":
      return /^-?\d+$/.test(raw) ? Number(raw) : raw; // a non-number goes as typed: the server says why
    case "float":
      return raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw;
    default:
      return raw;
  }
}

/** The request body: every enabled named control, nested by the dots of its name. */
function body() {
  const out = {};
  for (const input of form.elements) {
    if (!input.name || !input.dataset.type || input.matches(":disabled")) continue;
    const v = value(input);
    if (v === undefined) continue;
    const path = input.name.split(".");
    let node = out;
    for (const key of path.slice(0, -1)) node = node[key] ||= {};
    node[path[path.length - 1]] = v;
  }
  return out;
}

function clearErrors() {
  showMessage(general, "");
  for (const node of form.querySelectorAll("[data-error-for]")) node.textContent = "";
  for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
}

function showErrors(err) {
  const unplaced = [...err.general];
  let first = null;
  for (const [key, messages] of Object.entries(err.fields)) {
    const slot = form.querySelector(`[data-error-for="${CSS.escape(key)}"]`);
    const input = form.querySelector(`[name="${CSS.escape(key)}"]`);
    if (!slot || !input || input.matches(":disabled")) {
      unplaced.push(`${key}: ${messages.join(" ")}`);
      continue;
    }
    slot.textContent = messages.join(" ");
    input.setAttribute("aria-invalid", "true");
    first ||= input;
  }
  if (unplaced.length) {
    general.replaceChildren(
      el("p", {}, err.status === 409 ? "The job was not created:" : "Please check the job:"),
      el("ul", {}, unplaced.map((m) => el("li", {}, m))),
    );
    general.hidden = false;
    general.dataset.status = String(err.status);
  }
  if (unplaced.length || !first) {
    general.tabIndex = -1;
    general.focus();
  } else {
    first.focus();
  }
}

/** Device-hours for people: three significant figures. */
function hours(value) {
  return `${Number(value.toPrecision(3))} device-hours`;
}

let estimateTimer = null;
let estimateSeq = 0;

/** Ask for the estimate of the form as it is now; an answer to an older form is dropped. */
async function estimate() {
  clearTimeout(estimateTimer);
  if (estimateButton.disabled) return; // viewers: the API would refuse
  const seq = ++estimateSeq;
  estimateOut.dataset.state = "loading";
  try {
    const e = await api("jobs/estimate/", { method: "POST", body: body() });
    if (seq !== estimateSeq) return;
    estimateOut.dataset.state = "ready";
    estimateOut.dataset.dedicated = String(e.dedicated_device_hours);
    estimateOut.dataset.multiplexed = String(e.multiplexed_device_hours);
    estimateOut.dataset.basis = e.basis;
    const saved = e.savings === null ? "" : `, ${Math.round(e.savings * 100)} % less`;
    estimateOut.replaceChildren(
      el("span", {}, `Dedicated: ${hours(e.dedicated_device_hours)}; multiplexed: ${hours(e.multiplexed_device_hours)}${saved}. `),
      el("span", { class: "muted" }, `About ${e.step_seconds.toFixed(1)} s per step, from ${e.basis === "profile" ? "a finished job of the same shape" : "the cost model"}.`),
    );
  } catch (err) {
    if (seq !== estimateSeq) return;
    estimateOut.dataset.state = "error";
    delete estimateOut.dataset.dedicated;
    delete estimateOut.dataset.multiplexed;
    estimateOut.textContent = err.fields
      ? `No estimate: ${Object.entries(err.fields).map(([k, m]) => `${k}: ${m.join(" ")}`).join("; ")}`
      : `No estimate: ${err.message}`;
  }
}

function estimateSoon() {
  clearTimeout(estimateTimer);
  estimateTimer = setTimeout(estimate, ESTIMATE_DELAY_MS);
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors();
  submit.disabled = true;
  try {
    const job = await api("jobs/", { method: "POST", body: body() });
    window.location.assign(`/jobs/${job.id}/`);
  } catch (err) {
    if (err.fields) showErrors(err);
    else showMessage(general, `Could not submit: ${err.message}`);
    submit.disabled = false;
  }
});

task.addEventListener("change", followTask);
form.addEventListener("input", estimateSoon);
form.addEventListener("change", estimateSoon);
estimateButton.addEventListener("click", estimate);
followTask();
estimate();
loadChoices().catch((err) => showMessage(general, `Could not load models and datasets: ${err.message}`));
