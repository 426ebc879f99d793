// /jobs/: the organization's jobs, refreshed every few seconds from GET /api/v1/jobs/, with their
// latest reward, held-out accuracy and cost (sorted by the server, across all pages, by a click on
// the column's head); runs ticked here open side by side on the compare page.
import { api } from "./api.js";
import { badge, el, num, showMessage, when } from "./dom.js";

const POLL_MS = 3000;
const table = document.getElementById("job-table");
const rows = document.getElementById("job-rows");
const empty = document.getElementById("jobs-empty");
const error = document.getElementById("jobs-error");
const updated = document.getElementById("jobs-updated");
const filters = document.getElementById("job-filters");
const stateSelect = document.getElementById("filter-state");
const search = document.getElementById("filter-search");

// the filters live in the address too, so a filtered list can be bookmarked and reloaded
const params = new URLSearchParams(window.location.search);
stateSelect.value = params.get("state") || "";
search.value = params.get("search") || "";
let ordering = params.get("ordering") || ""; // "-latest_reward": largest first; "": newest first

const picked = new Set(); // ids of the runs ticked for comparison
const compareButton = document.getElementById("compare-selected");

function pick(id, on) {
  if (on) picked.add(id);
  else picked.delete(id);
  compareButton.disabled = picked.size < 2 || picked.size > 8;
  compareButton.textContent = `Compare selected runs (${picked.size})`;
}

compareButton.addEventListener("click", () => {
  window.location.href = `/compare/?jobs=${[...picked].join(",")}`;
});

function row(job) {
  return el(
    "tr",
    { dataset: { job: job.id, state: job.state } },
    el("td", {}, el("input", { type: "checkbox", "aria-label": `Compare job ${job.id}`, checked: picked.has(job.id),
      on: { change: (event) => pick(job.id, event.target.checked) } })),
    el("td", {}, `#${job.id}`),
    el("td", {}, el("a", { href: `/jobs/${job.id}/` }, job.name || "(unnamed)")),
    el(
      "td",
      {},
      badge(job.state),
      // a job held by the plan's concurrent-job limit says why it waits
      job.waiting_for_slot ? el("div", { class: "muted small job-reason" }, job.state_reason) : null,
    ),
    el("td", { class: "num" }, job.last_step ?? "–"),
    el("td", { class: "num" }, num(job.latest_reward)),
    el("td", { class: "num" }, num(job.eval_accuracy)),
    el("td", { class: "num" }, num(job.device_hours, 4)),
    el("td", { class: "num" }, `${job.rollout_devices} + ${job.train_devices}`),
    el("td", {}, job.deployment_mode.replaceAll("_", " ")),
    el("td", {}, job.created_by ?? "–"),
    el("td", {}, when(job.created_at)),
  );
}

let timer = null;
async function refresh() {
  clearTimeout(timer);
  try {
    const page = await api("jobs/", { query: { state: stateSelect.value, search: search.value.trim(), ordering } });
    rows.replaceChildren(...page.results.map(row));
    empty.hidden = page.results.length > 0;
    table.dataset.loaded = "true";
    table.dataset.count = String(page.count);
    showMessage(error, "");
    updated.textContent = `Updated ${when(Date.now() / 1000)}.`;
  } catch (err) {
    showMessage(error, `Could not load the jobs: ${err.message}`);
  }
  timer = setTimeout(refresh, POLL_MS);
}

function showOrdering() {
  for (const button of document.querySelectorAll("button.sort")) {
    const key = ordering.replace(/^-/, "");
    button.parentElement.setAttribute("aria-sort", button.dataset.sort !== key ? "none"
      : ordering.startsWith("-") ? "descending" : "ascending");
  }
}

for (const button of document.querySelectorAll("button.sort")) {
  button.addEventListener("click", () => {
    // a first click: largest first; a second on the same column: smallest first
    ordering = ordering === `-${button.dataset.sort}` ? button.dataset.sort : `-${button.dataset.sort}`;
    showOrdering();
    applyFilters();
  });
}
showOrdering();

function applyFilters() {
  const next = new URLSearchParams();
  if (stateSelect.value) next.set("state", stateSelect.value);
  if (search.value.trim()) next.set("search", search.value.trim());
  if (ordering) next.set("ordering", ordering);
  const query = next.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
  refresh();
}

filters.addEventListener("submit", (event) => {
  event.preventDefault();
  applyFilters();
});
stateSelect.addEventListener("change", applyFilters);
let typing = null;
search.addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(applyFilters, 300);
});
refresh();
