// The REST API under /api/v1/ with the session cookie: JSON in and out, the CSRF token on writes,
// and the API's error shapes turned into field messages and a general message.

/** The page's CSRF token (base.html renders it in a meta tag). */
export function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

/** An API answer other than 2xx: `status`, the parsed `body`, and `fields` / `general` messages. */
export class ApiError extends Error {
  constructor(status, body) {
    const { fields, general } = errorMessages(body, status);
    super(general.join(" ") || Object.values(fields).flat().join(" ") || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.fields = fields;
    this.general = general;
  }
}

/**
 * Flatten the API's error body into {fields: {"spec.steps": [...], ...}, general: [...]}.
 * Shapes: {"detail": "..."} (403, 404, 409), {"non_field_errors": [...]}, {"field": ["..."]},
 * nested serializer errors {"spec": {"steps": [...]}} (joined with dots, like services.parse_spec's
 * "spec.steps" keys).
 */
export function errorMessages(body, status = 400) {
  const fields = {};
  const general = [];
  const walk = (value, key) => {
    if (value == null) return;
    if (Array.isArray(value)) {
      value.forEach((item) => (typeof item === "object" ? walk(item, key) : add(key, String(item))));
    } else if (typeof value === "object") {
      for (const [k, v] of Object.entries(value)) walk(v, key ? `${key}.${k}` : k);
    } else {
      add(key, String(value));
    }
  };
  const add = (key, message) => {
    if (!key || key === "detail" || key === "non_field_errors") general.push(message);
    else (fields[key] ||= []).push(message);
  };
  if (body && typeof body === "object") walk(body, "");
  else if (typeof body === "string" && body) general.push(body.slice(0, 300));
  else general.push(`The server answered ${status}.`);
  return { fields, general };
}

/**
 * Call the API: `api("jobs/", {method: "POST", body: {...}, query: {state: "running"}})`; a
 * `FormData` body goes as multipart (uploads), any other as JSON.
 * `path` is relative to /api/v1/ (or absolute when it starts with "/"). Resolves to the parsed
 * JSON (null for 204); rejects with ApiError on a non-2xx answer.
 */
export async function api(path, { method = "GET", body, query } = {}) {
  const url = new URL(path.startsWith("/") ? path : `/api/v1/${path}`, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  const init = { method, headers, credentials: "same-origin" };
  if (method !== "GET" && method !== "HEAD") {
    headers["X-CSRFToken"] = csrfToken();
    if (body instanceof FormData) {
      init.body = body; // multipart: the browser writes the Content-Type with its boundary
    } else {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body ?? {});
    }
  }
  const response = await fetch(url, init);
  if (response.status === 204) return null;
  const text = await response.text();
  let data = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // not JSON (an HTML error page): keep the text
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** Every item of a paginated list ({count, next, results}), following `next` up to `maxPages`. */
export async function listAll(path, query = {}, maxPages = 20) {
  const items = [];
  let page = await api(path, { query: { page_size: 200, ...query } });
  for (let n = 1; ; n += 1) {
    items.push(...(page.results || []));
    if (!page.next || n >= maxPages) return items;
    const next = new URL(page.next);
    page = await api(next.pathname + next.search);
  }
}

/** The page's data (config.pages renders it with json_script as #page-data). */
export function pageData() {
  const node = document.getElementById("page-data");
  return node ? JSON.parse(node.textContent) : {};
}
