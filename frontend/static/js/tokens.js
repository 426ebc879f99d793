// /tokens/: the user's API tokens in the current organization (GET /api/v1/tokens/), a form that
// creates one (its plaintext is shown once, with a copy button) and a revoke button per token.
import { api, listAll } from "./api.js";
import { el, showMessage, when } from "./dom.js";

const error = document.getElementById("tokens-error");
const form = document.getElementById("token-form");
const created = document.getElementById("token-created");
const plaintext = document.getElementById("token-plaintext");
const copied = document.getElementById("token-copied");

function status(token) {
  if (token.revoked_at) return "revoked";
  if (token.expires_at && new Date(token.expires_at) < new Date()) return "expired";
  return "active";
}

function row(token) {
  const state = status(token);
  const revoke = state === "active"
    ? el("button", { type: "button", class: "danger", "aria-label": `Revoke token ${token.name} (${token.prefix})`,
      on: { click: () => revokeToken(token) } }, "Revoke")
    : "";
  return el("tr", { dataset: { token: token.id, status: state } },
    el("th", { scope: "row" }, token.name),
    el("td", { class: "mono" }, `${token.prefix}…`),
    el("td", {}, when(token.created_at)),
    el("td", {}, token.expires_at ? when(token.expires_at) : "never"),
    el("td", {}, when(token.last_used_at)),
    el("td", {}, state),
    el("td", {}, revoke));
}

async function load() {
  const tokens = await listAll("tokens/");
  document.getElementById("token-rows").replaceChildren(...tokens.map(row));
  document.getElementById("token-table").dataset.loaded = "true";
}

async function revokeToken(token) {
  showMessage(error, "");
  try {
    await api(`tokens/${token.id}/revoke/`, { method: "POST" });
    await load();
  } catch (err) {
    showMessage(error, `Could not revoke: ${err.message}`);
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  showMessage(error, "");
  for (const slot of document.querySelectorAll("[data-error-for]")) slot.textContent = "";
  const days = document.getElementById("token-days").value.trim();
  const body = { name: document.getElementById("token-name").value.trim() };
  if (days) body.expires_days = /^\d+$/.test(days) ? Number(days) : days;
  try {
    const token = await api("tokens/", { method: "POST", body });
    plaintext.value = token.token;
    copied.textContent = "";
    created.hidden = false;
    plaintext.focus();
    plaintext.select();
    await load();
  } catch (err) {
    for (const [key, messages] of Object.entries(err.fields || {})) {
      const slot = document.querySelector(`[data-error-for="${CSS.escape(key)}"]`);
      if (slot) slot.textContent = messages.join(" ");
      else err.general.push(`${key}: ${messages.join(" ")}`);
    }
    showMessage(error, (err.general || [err.message]).join(" "));
  }
});

document.getElementById("token-copy").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(plaintext.value);
    copied.textContent = "Copied.";
  } catch {
    plaintext.select(); // no clipboard access (plain http): leave it selected for Ctrl+C
    copied.textContent = "Selected: press Ctrl+C to copy.";
  }
});

load().catch((err) => showMessage(error, `Could not load the tokens: ${err.message}`));
