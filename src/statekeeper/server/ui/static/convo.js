// A run's conversation, drawn inline with its timeline: the messages of the run's session
// (user input, assistant text, tool calls with their arguments, tool results, handoffs).
// Events that name a message (a model's answer, a tool's result) carry it under them; the
// messages no event names (the user's input, a follow-up) stand between the events, where
// their time puts them.

import { api, query } from "./api.js";
import { clear, h, pretty } from "./dom.js";

/** The messages of the run's session written since the run started, by id, in order. */
export async function runMessages(run) {
  const found = new Map();
  const since = Date.parse(run.created_at || "") || 0;
  let after = 0;
  for (let page = 0; page < 10; page += 1) {
    const got = await api(`/sessions/${encodeURIComponent(run.session_id)}/entries`
      + query({ after_seq: after, limit: 1000 }));
    for (const entry of got.items || []) {
      if (entry.kind !== "message" || !entry.message) continue;
      if ((Date.parse(entry.created_at) || 0) < since) continue; // history before this run
      found.set(entry.id, entry);
    }
    if (got.next_after_seq === null || got.next_after_seq === undefined) break;
    after = got.next_after_seq;
  }
  return found;
}

/** The ids of the messages an event names (a model's answer, a tool's result). */
export function namedMessages(data) {
  const d = data && typeof data === "object" ? data : {};
  return [d.id, d.message].filter((v) => typeof v === "string" && v.startsWith("msg_"));
}

function blocks(message) {
  const content = message.content;
  if (typeof content === "string") return [{ type: "text", text: content }];
  return Array.isArray(content) ? content.filter((b) => b && typeof b === "object") : [];
}

/** One message as the operator reads it: who, what they said, which tools with what. */
export function messageView(entry) {
  const m = entry.message || {};
  const role = m.role || "message";
  const marker = m.metadata && m.metadata["statekeeper.marker"];
  const handoff = m.metadata && (m.metadata.handoff || m.metadata["statekeeper.handoff"]);
  const parts = [];
  for (const b of blocks(m)) {
    if (b.type === "text" && b.text) parts.push(h("p", { class: "say" }, b.text));
    else if (b.type === "tool_call") {
      parts.push(h("div", { class: "call" },
        h("span", { class: "muted" }, "calls "), h("code", {}, b.name || "tool"),
        h("span", { class: "muted" }, ` · ${b.id || ""}`),
        h("pre", { class: "args", "aria-label": `arguments of ${b.name || "tool"}` }, pretty(b.arguments ?? {}))));
    } else if (b.type === "tool_result") {
      parts.push(h("div", { class: `result${b.is_error ? " error" : ""}` },
        h("span", { class: "muted" }, `${b.is_error ? "error from" : "result of"} ${b.tool_call_id || b.call_id || "call"}`),
        h("pre", { class: "args" }, pretty(b.content))));
    } else if (b.type !== "text") parts.push(h("p", { class: "muted" }, `[${b.type}]`));
  }
  return h("div", { class: `msg msg-${role}`, "data-message": entry.id },
    h("span", { class: "who" }, marker ? String(marker) : role, handoff ? ` → ${handoff}` : ""),
    h("div", { class: "said" }, parts.length ? parts : h("span", { class: "muted" }, "(no text)")));
}

/** A timeline item for a message no event names (the user's input, a follow-up). */
export function messageItem(entry) {
  const role = (entry.message && entry.message.role) || "message";
  return h("li", { class: "ev ev-message", "data-at": entry.created_at, "data-type": `message/${role}` },
    h("span", { class: "seq" }, `#${entry.seq}`),
    h("span", { class: "etype" }, role),
    messageView(entry),
    h("span", {}));
}

/** Put each loaded message into the timeline once: under the event that names it, else
 * as an item of its own before the first event that happened after it. */
export function placeMessages(timeline, messages, shown) {
  for (const li of timeline.querySelectorAll("li[data-names]")) {
    for (const id of li.dataset.names.split(" ")) {
      const entry = messages.get(id);
      if (!entry || shown.has(id)) continue;
      shown.add(id);
      li.querySelector(".what").append(messageView(entry));
    }
  }
  const named = new Set([...timeline.querySelectorAll("li[data-names]")]
    .flatMap((li) => li.dataset.names.split(" ")));
  for (const [id, entry] of messages) {
    if (shown.has(id) || named.has(id)) continue;
    shown.add(id);
    const at = Date.parse(entry.created_at) || 0;
    const later = [...timeline.children].find((li) => (Date.parse(li.dataset.at || "") || 0) > at);
    timeline.insertBefore(messageItem(entry), later || null);
  }
}

/** Filters over the timeline: by stream (lifecycle, tool, assistant, approval, message,
 * ...) and by type (``tool/result``). Returns the controls and `update()`, to call after
 * items are added. */
export function timelineFilters(timeline) {
  const stream = h("select", { id: "ev-stream" }, h("option", { value: "" }, "all streams"));
  const type = h("select", { id: "ev-type" }, h("option", { value: "" }, "all types"));
  const options = (select, values, label) => {
    const have = [...select.options].slice(1).map((o) => o.value);
    if (values.join("\n") === have.join("\n")) return;
    const chosen = select.value;
    clear(select).append(h("option", { value: "" }, label), ...values.map((v) => h("option", { value: v }, v)));
    select.value = values.includes(chosen) ? chosen : "";
  };
  function update() {
    const items = [...timeline.children];
    const types = [...new Set(items.map((li) => li.dataset.type).filter(Boolean))].sort();
    options(stream, [...new Set(types.map((t) => t.split("/")[0]))], "all streams");
    options(type, types.filter((t) => !stream.value || t.startsWith(`${stream.value}/`)), "all types");
    for (const li of items) {
      const t = li.dataset.type || "";
      li.hidden = Boolean((stream.value && !t.startsWith(`${stream.value}/`)) || (type.value && t !== type.value));
    }
  }
  stream.addEventListener("change", update);
  type.addEventListener("change", update);
  const controls = h("div", { class: "filters", role: "search", "aria-label": "Filter the timeline" },
    h("label", { for: "ev-stream" }, "Stream ", stream), h("label", { for: "ev-type" }, "Type ", type));
  return { controls, update };
}
