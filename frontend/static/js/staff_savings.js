// /staff/savings/ (platform staff): the cluster's monthly report, GET /api/v1/billing/cluster/:
// capacity, what each organization was billed with its savings, and the idle device-hours.
import { api } from "./api.js";
import { el, num, percent, showMessage } from "./dom.js";

const error = document.getElementById("staff-error");

async function load(month) {
  const report = await api("billing/cluster/", { query: { month } });
  document.getElementById("month-input").value = report.month;
  document.getElementById("staff-csv").href = `/api/v1/billing/cluster/?format=csv&month=${encodeURIComponent(report.month)}`;
  document.getElementById("staff-capacity").textContent = `${num(report.capacity_device_hours)} device-h`;
  document.getElementById("staff-billed").textContent = `${num(report.billed_device_hours)} device-h`;
  document.getElementById("staff-idle").textContent = `${num(report.idle_device_hours)} device-h`;
  showMessage(document.getElementById("staff-over"), report.over_capacity
    ? `More was billed than the capacity samples show, by ${num(report.over_capacity_device_hours)} device-hours.` : "");
  document.getElementById("staff-rows").replaceChildren(...report.organizations.map((org) =>
    el("tr", { dataset: { organization: org.organization } },
      el("th", { scope: "row" }, org.name),
      el("td", { class: "num" }, org.jobs),
      el("td", { class: "num" }, num(org.device_hours)),
      el("td", { class: "num" }, num(org.counterfactual_device_hours)),
      el("td", { class: "num" }, percent(org.savings)))));
  document.getElementById("staff-table").dataset.loaded = "true";
}

document.getElementById("month-form").addEventListener("submit", (event) => {
  event.preventDefault();
  showMessage(error, "");
  load(document.getElementById("month-input").value).catch((err) => showMessage(error, err.message));
});
load("").catch((err) => showMessage(error, `Could not load the report: ${err.message}`));
