// Small DOM helpers. Text always goes in through textContent: nothing from the API is parsed as HTML.

/**
 * Make an element: el("td", {class: "num", dataset: {step: 3}}, "text", childNode, ...).
 * Attributes: `class`, `dataset` (an object), `on` ({click: fn}), `text`, any other as an attribute
 * (false / null / undefined skip it, true sets it empty).
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Show `message` in `node` (an error paragraph), or hide it when the message is empty. */
export function showMessage(node, message) {
  if (!node) return;
  node.textContent = message || "";
  node.hidden = !message;
}

/** A number with `digits` decimals, or "–" for null / undefined / NaN. */
export function num(value, digits = 3) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

/** A fraction as a percentage ("12.5 %"), or "–". */
export function percent(value, digits = 1) {
  return typeof value === "number" && Number.isFinite(value) ? `${(value * 100).toFixed(digits)} %` : "–";
}

/** An ISO date-time or Unix seconds as local "YYYY-MM-DD HH:MM:SS", or "–". */
export function when(value) {
  if (value === null || value === undefined || value === "") return "–";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(date.getTime())) return "–";
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** A state badge: <span class="badge" data-state="running">running</span>. */
export function badge(state) {
  return el("span", { class: "badge", dataset: { state } }, state);
}
