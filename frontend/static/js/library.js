// /library/: the organization's models and datasets (GET /api/v1/models/, /api/v1/datasets/), with
// upload forms for members (multipart POSTs; the server's error shows beside its field and nothing
// is kept) and a delete button on what the user may delete.
import { api, listAll, pageData } from "./api.js";
import { el, showMessage, when } from "./dom.js";

const data = pageData();
const error = document.getElementById("library-error");

function bytes(value) {
  if (typeof value !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return `${unit ? size.toFixed(1) : size} ${units[unit]}`;
}

function deleteButton(label, path) {
  return el("button", { type: "button", class: "danger", "aria-label": label, on: { click: () => remove(path) } },
    "Delete");
}

async function remove(path) {
  showMessage(error, "");
  try {
    await api(path, { method: "DELETE" });
    await load();
  } catch (err) {
    showMessage(error, `Could not delete: ${err.message}`);
  }
}

function modelRow(model) {
  const own = model.scope === "organization";
  return el("tr", { dataset: { model: model.id ?? model.name, scope: model.scope } },
    el("th", { scope: "row" }, model.name),
    el("td", {}, model.scope),
    el("td", {}, model.architecture || "–"),
    el("td", { class: "num" }, model.parameters ? model.parameters.toLocaleString("en") : "–"),
    el("td", { class: "num" }, bytes(model.size_bytes)),
    el("td", {}, when(model.created_at)),
    el("td", {}, own && data.can_write ? deleteButton(`Delete model ${model.name}`, `models/${model.id}/`) : ""));
}

function datasetRow(dataset) {
  return el("tr", { dataset: { dataset: dataset.id } },
    el("th", { scope: "row" }, dataset.name),
    el("td", { class: "num" }, dataset.problems),
    el("td", { class: "num" }, dataset.eval_problems ?? "held-out split"),
    el("td", { class: "num" }, bytes(dataset.size_bytes)),
    el("td", {}, dataset.created_by || "–"),
    el("td", {}, when(dataset.created_at)),
    el("td", {}, data.can_write ? deleteButton(`Delete dataset ${dataset.name}`, `datasets/${dataset.id}/`) : ""));
}

async function load() {
  const [models, datasets] = await Promise.all([api("models/"), listAll("datasets/")]);
  document.getElementById("model-rows").replaceChildren(...models.map(modelRow));
  document.getElementById("dataset-rows").replaceChildren(...datasets.map(datasetRow));
  document.getElementById("model-table").dataset.loaded = "true";
  document.getElementById("dataset-table").dataset.loaded = "true";
}

/** Post `form` as multipart to `path`; the server's field errors go to the form's slots. `pending` is
 * what the status line says while the upload and the server's check run. */
function uploadForm(form, name, path, describe, pending) {
  const done = document.getElementById(`${name}-uploaded`);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showMessage(error, "");
    showMessage(done, pending);
    for (const slot of document.querySelectorAll(`[data-form="${name}"]`)) slot.textContent = "";
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const body = new FormData(form);
      for (const [key, value] of [...body.entries()]) {
        // an unset optional control (no evaluation file, the format by the file's name) is left out
        if (value === "" || (value instanceof File && !value.name)) body.delete(key);
      }
      const created = await api(path, { method: "POST", body });
      form.reset();
      showMessage(done, describe(created));
      await load();
    } catch (err) {
      showMessage(done, "");
      for (const [key, messages] of Object.entries(err.fields || {})) {
        const slot = document.querySelector(`[data-form="${name}"][data-error-for="${CSS.escape(key)}"]`);
        if (slot) slot.textContent = messages.join(" ");
        else err.general.push(`${key}: ${messages.join(" ")}`);
      }
      showMessage(error, (err.general || [err.message]).join(" "));
    } finally {
      button.disabled = false;
    }
  });
}

for (const id of ["model-limit", "dataset-limit"]) {
  const node = document.getElementById(id);
  if (node) node.textContent = bytes(Number(node.dataset.bytes));
}
const modelForm = document.getElementById("model-form");
if (modelForm) {
  uploadForm(modelForm, "model", "models/upload/",
    (m) => `Uploaded model ${m.name}: ${m.architecture}, ${m.parameters.toLocaleString("en")} parameters.`,
    "Uploading the model and checking it (its architecture is built to compare every tensor's shape)…");
  modelForm.dataset.ready = "true";
}
const datasetForm = document.getElementById("dataset-form");
if (datasetForm) {
  uploadForm(datasetForm, "dataset", "datasets/", (d) => `Uploaded dataset ${d.name}: ${d.problems} problems.`,
    "Uploading the dataset and checking it…");
}
load().catch((err) => showMessage(error, `Could not load models and datasets: ${err.message}`));
