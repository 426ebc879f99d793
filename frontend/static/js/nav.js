// The site header's organization switcher: POST organizations/<id>/switch/, then reload the page
// (every page acts within the session's current organization).
import { api } from "./api.js";
import { showMessage } from "./dom.js";

const form = document.getElementById("org-switcher");
if (form) {
  const select = document.getElementById("org-select");
  const error = document.getElementById("org-switch-error");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showMessage(error, "");
    try {
      await api(`organizations/${encodeURIComponent(select.value)}/switch/`, { method: "POST" });
      // a job page of the old organization would be a 404 in the new one
      if (/^\/jobs\/\d+\/$/.test(window.location.pathname)) window.location.assign("/jobs/");
      else window.location.reload();
    } catch (err) {
      showMessage(error, err.message);
    }
  });
}
