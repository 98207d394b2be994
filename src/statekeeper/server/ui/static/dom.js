// Small DOM helpers. Text always goes in as text nodes (never innerHTML), so stored data
// (messages, tool arguments, errors) cannot inject markup into the page.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "style") {
      Object.assign(el.style, value); // CSSOM: allowed by the page's style-src 'self'
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** h("a", {href: "#/"}, "text", child...) builds an element. */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** Same for SVG elements. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Append children to el, skipping null / false (native append would print "null"). */
export function put(el, ...children) {
  return fill(el, {}, children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** A short, human time: "12:03:04" today, else the date and time. */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

export function money(value) {
  if (value === null || value === undefined) return "–";
  const n = Number(value);
  return n < 0.01 && n > 0 ? `$${n.toPrecision(2)}` : `$${n.toFixed(2)}`;
}

export function shortId(id) {
  if (!id) return "";
  const text = String(id);
  return text.length > 18 ? `${text.slice(0, 6)}…${text.slice(-8)}` : text;
}

export function statusBadge(status) {
  const name = String(status || "unknown").toLowerCase();
  return h("span", { class: `badge status-${name}` }, name.replaceAll("_", " "));
}

/** Pretty JSON for a <pre>. Arguments may arrive as a JSON string or as data. */
export function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}

/** Announce a change to screen readers (the page's polite live region). */
export function announce(text) {
  const region = document.getElementById("announcer");
  if (region) region.textContent = text;
}

/** The header's live indicator: "live", "reconnecting", "stopped" or "off". */
export function setLive(state) {
  const el = document.getElementById("live");
  if (!el) return;
  // "off": the page follows no stream, so the indicator says nothing.
  const labels = { live: "● live", reconnecting: "◌ reconnecting", stopped: "○ offline", off: "" };
  el.textContent = labels[state] || labels.off;
  el.className = `live live-${state}`;
  el.setAttribute("aria-label", `Live updates: ${state}`);
}

/** An error in place of (or on top of) a page: the library's error type and message. */
export function problem(container, err) {
  const text = err && err.type && err.message ? `${err.type}: ${err.message}` : String(err && err.message ? err.message : err);
  const el = h("p", { class: "error", role: "alert" }, text);
  if (err && err.status === 401) return el; // the login form replaces the page and says why
  container.prepend(el);
  return el;
}

/** Redraw `container` with `draw()` without losing the keyboard's place: the element
 * that had focus inside it is found again (by id, label or text) and focused. */
export function keepFocus(container, draw) {
  const active = document.activeElement;
  const inside = active && active !== document.body && container.contains(active);
  const mark = inside
    ? { tag: active.tagName, id: active.id, label: active.getAttribute("aria-label"), text: active.textContent }
    : null;
  // Rows and cards carry data-run / data-call / data-seq: look again inside the same one.
  const holder = inside ? active.closest("[data-run],[data-call],[data-seq]") : null;
  const attr = holder ? ["data-run", "data-call", "data-seq"].find((a) => holder.hasAttribute(a)) : null;
  const where = attr ? `[${attr}="${CSS.escape(holder.getAttribute(attr))}"]` : null;
  draw();
  if (!mark) return;
  const scope = (where && container.querySelector(where)) || container;
  const same = [...scope.querySelectorAll(mark.tag)].find((el) =>
    (mark.id && el.id === mark.id) || (mark.label && el.getAttribute("aria-label") === mark.label)
    || (!mark.id && !mark.label && el.textContent === mark.text));
  if (same && !same.disabled) same.focus({ preventScroll: true });
}

/** Whether the user is typing in a field inside `container` (a redraw would lose it). */
export function typingIn(container) {
  const active = document.activeElement;
  return Boolean(active && container.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName));
}

/** Who made a decision, as a person reads it: a key's label (its id stays in `title`),
 * from `decided_by` = "Label (key:k…)"; other authors ("key:k…", "cli", "ops") as they are. */
export function author(decidedBy) {
  const { name, key } = authorOf(decidedBy);
  return h("span", { title: key ? `key ${key}` : undefined }, name);
}

/** `decided_by` split into the name a person reads and the key id, if any. */
export function authorOf(decidedBy) {
  const text = String(decidedBy || "?");
  const found = /^(.*) \(key:([^)]+)\)$/.exec(text);
  return found ? { name: found[1], key: found[2] } : { name: text, key: null };
}

/** The API path of a run. */
export const runPath = (id) => `/runs/${encodeURIComponent(id)}`;
