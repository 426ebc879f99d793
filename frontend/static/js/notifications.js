// /notifications/: the events of the user's own jobs they are e-mailed about
// (GET/PUT /api/v1/notifications/email/) and, for admins and owners, the organization's webhooks
// (GET/POST /api/v1/webhooks/, DELETE webhooks/{id}/) with a webhook's delivery log
// (GET webhooks/{id}/deliveries/).
import { api, listAll, pageData } from "./api.js";
import { el, showMessage, when } from "./dom.js";

const data = pageData();
const error = document.getElementById("notifications-error");

function checkboxes(fieldset, name, checked) {
  fieldset.append(...data.events.map((event) => el("label", {},
    el("input", { type: "checkbox", name, value: event.value, checked: checked.includes(event.value) }),
    ` ${event.label}`)));
}

function chosen(fieldset) {
  return [...fieldset.querySelectorAll("input:checked")].map((box) => box.value);
}

async function loadEmail() {
  const choice = await api("notifications/email/");
  checkboxes(document.getElementById("email-events"), "email", choice.events);
}

document.getElementById("email-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showMessage(error, "");
  try {
    await api("notifications/email/", { method: "PUT", body: { events: chosen(document.getElementById("email-events")) } });
    document.getElementById("email-saved").textContent = "Saved.";
  } catch (err) {
    showMessage(error, `Could not save: ${err.message}`);
  }
});

function webhookRow(hook) {
  return el("tr", { dataset: { webhook: hook.id } },
    el("th", { scope: "row", class: "mono" }, hook.url),
    el("td", {}, hook.events.join(", ")),
    el("td", { class: "mono" }, hook.secret_hint),
    el("td", {}, when(hook.created_at)),
    el("td", {},
      el("button", { type: "button", on: { click: () => loadDeliveries(hook) } }, "Delivery log"), " ",
      el("button", { type: "button", class: "danger", "aria-label": `Remove the webhook to ${hook.url}`,
        on: { click: () => removeWebhook(hook) } }, "Remove")));
}

function deliveryRow(delivery) {
  return el("tr", { dataset: { delivery: delivery.id, state: delivery.state } },
    el("th", { scope: "row" }, delivery.event),
    el("td", {}, delivery.job ? el("a", { href: `/jobs/${delivery.job}/` }, `#${delivery.job}`) : "–"),
    el("td", {}, delivery.state),
    el("td", {}, String(delivery.attempts)),
    el("td", {}, delivery.response_status ? String(delivery.response_status) : (delivery.error || "–")),
    el("td", {}, delivery.next_attempt_at ? when(delivery.next_attempt_at) : "–"),
    el("td", {}, delivery.delivered_at ? when(delivery.delivered_at) : "–"));
}

async function loadWebhooks() {
  const hooks = await listAll("webhooks/");
  document.getElementById("webhook-rows").replaceChildren(...hooks.map(webhookRow));
  document.getElementById("webhook-table").dataset.loaded = "true";
  if (hooks.length) await loadDeliveries(hooks[0]);
}

async function loadDeliveries(hook) {
  const deliveries = await listAll(`webhooks/${hook.id}/deliveries/`);
  document.getElementById("deliveries-of").textContent = `(${hook.url})`;
  document.getElementById("delivery-rows").replaceChildren(...deliveries.map(deliveryRow));
  document.getElementById("delivery-table").dataset.loaded = "true";
}

async function removeWebhook(hook) {
  showMessage(error, "");
  try {
    await api(`webhooks/${hook.id}/`, { method: "DELETE" });
    document.getElementById("delivery-rows").replaceChildren();
    await loadWebhooks();
  } catch (err) {
    showMessage(error, `Could not remove: ${err.message}`);
  }
}

document.getElementById("webhook-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showMessage(error, "");
  for (const slot of document.querySelectorAll("[data-error-for]")) slot.textContent = "";
  const body = { url: document.getElementById("webhook-url").value.trim(),
    events: chosen(document.getElementById("webhook-events")) };
  try {
    const hook = await api("webhooks/", { method: "POST", body });
    document.getElementById("webhook-secret").value = hook.secret;
    document.getElementById("webhook-created").hidden = false;
    await loadWebhooks();
  } catch (err) {
    if (Object.keys(err.fields || {}).length) {
      for (const [field, messages] of Object.entries(err.fields)) {
        const slot = document.querySelector(`[data-error-for="${field}"]`);
        if (slot) slot.textContent = messages.join(" ");
      }
    } else {
      showMessage(error, `Could not add: ${err.message}`);
    }
  }
});

loadEmail().catch((err) => showMessage(error, `Could not load: ${err.message}`));
if (data.manages_webhooks) {
  document.getElementById("webhooks").hidden = false;
  checkboxes(document.getElementById("webhook-events"), "webhook-event", data.events.map((event) => event.value));
  loadWebhooks().catch((err) => showMessage(error, `Could not load the webhooks: ${err.message}`));
}
