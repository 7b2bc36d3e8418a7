// Shared by the playground and the dashboard: the API key, authorised fetches, drafter colours.
// Plain ES modules served from /static: no framework, no build step, nothing from the network.

const KEY_STORAGE = "specdec.apiKey";

// One colour per drafter, in the server's chain order; the target's own tokens stay plain.
export const PALETTE = ["#1a9e5a", "#1b86c4", "#b04fc4", "#d08a00", "#4a5ad8", "#d0453d"];
export const TARGET = "target";

export const $ = (selector, root = document) => root.querySelector(selector);

export function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

export function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// The header's key field: remembered in this browser only (localStorage), sent as a Bearer token.
export function setupKeyInput(onChange = () => {}) {
  const input = $("#api-key");
  input.value = apiKey();
  input.addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, input.value.trim());
    onChange();
  });
}

// GET a JSON route; throws an Error carrying the server's OpenAI-style message.
export async function getJSON(path) {
  const res = await fetch(path, { headers: authHeaders() });
  const body = await res.json().catch(() => null);
  if (!res.ok) {
    const err = new Error(body?.error?.message || `${res.status} ${res.statusText}`);
    err.status = res.status;
    throw err;
  }
  return body;
}

export function loadConfig() {
  return getJSON("/playground/config");
}

export class Colors {
  constructor(drafters) {
    this.map = new Map(drafters.map((name, i) => [name, PALETTE[i % PALETTE.length]]));
  }

  of(origin) {
    if (origin === TARGET) return null;
    if (!this.map.has(origin)) this.map.set(origin, PALETTE[this.map.size % PALETTE.length]);
    return this.map.get(origin);
  }
}

export function legend(container, names, colors) {
  container.replaceChildren();
  for (const name of [...names, TARGET]) {
    const item = el("span", { class: "legend-item" });
    const swatch = el("span", { class: "swatch" });
    const color = colors.of(name);
    if (color) swatch.style.background = color;
    else swatch.classList.add("plain");
    item.append(swatch, document.createTextNode(name === TARGET ? "target (recovered / bonus)" : name));
    container.append(item);
  }
}
