// The server's JSON API and its event stream, with the API key from the login form.

const KEY = "statekeeper.apiKey";
export const BASE = "/api/v1";

export const auth = {
  get key() {
    return sessionStorage.getItem(KEY) || "";
  },
  save(key) {
    sessionStorage.setItem(KEY, key.trim());
  },
  forget() {
    sessionStorage.removeItem(KEY);
  },
};

/** An error answer of the API: its HTTP status and the library's error type. */
export class ApiError extends Error {
  constructor(status, type, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.type = type || "HTTPError";
  }
}

function headers(extra) {
  const out = { Accept: "application/json", ...extra };
  if (auth.key) out.Authorization = `Bearer ${auth.key}`;
  return out;
}

// A 401 for `key`, the key the request carried: the app ignores it if that key is no
// longer the one in use (a late answer to a request sent before a new sign-in).
function unauthorized(key) {
  window.dispatchEvent(new CustomEvent("sk:unauthorized", { detail: { key } }));
}

/** Call the JSON API: api("/runs"), api("/runs/x/approve", {method: "POST", body: {...}}). */
export async function api(path, { method = "GET", body, signal } = {}) {
  const sent = auth.key;
  const init = { method, signal, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(BASE + path, init);
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: { type: "HTTPError", message: text.slice(0, 300) } };
  }
  if (!res.ok) {
    if (res.status === 401) unauthorized(sent);
    const err = (data && data.error) || {};
    throw new ApiError(res.status, err.type, err.message || (data && data.detail && JSON.stringify(data.detail)));
  }
  return data;
}

/** Query string from an object, leaving out empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

function parseBlock(block) {
  const event = { id: null, type: "message", data: "" };
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") event.id = value;
    else if (field === "event") event.type = value;
    else if (field === "data") data.push(value);
  }
  event.data = data.join("\n");
  return data.length ? event : null;
}

/**
 * Follow the server's event stream (per tenant, or per run with {run_id}). Read with
 * fetch rather than EventSource so the key travels in the Authorization header (never
 * in a URL a log would keep) and every event type arrives in one handler. After a
 * dropped connection it reconnects with Last-Event-ID, so nothing is missed or repeated.
 * Returns a function that stops it. onState gets "live", "reconnecting" or "stopped".
 */
export function follow(params, onEvent, onState = () => {}) {
  const controller = new AbortController();
  let lastId = params.last_event_id || null;
  let delay = 500;
  const url = BASE + "/stream" + query({ ...params, last_event_id: undefined });

  async function once() {
    const extra = { Accept: "text/event-stream" };
    if (lastId) extra["Last-Event-ID"] = lastId;
    const sent = auth.key;
    const res = await fetch(url, { headers: headers(extra), signal: controller.signal });
    if (res.status === 401) {
      unauthorized(sent);
      throw new ApiError(401, "AuthenticationError", "the API key was refused");
    }
    if (!res.ok || !res.body) throw new ApiError(res.status, "HTTPError", `stream answered ${res.status}`);
    onState("live");
    delay = 500;
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replaceAll("\r\n", "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = parseBlock(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (!event) continue;
        if (event.id) lastId = event.id;
        let data = event.data;
        try {
          data = JSON.parse(event.data);
        } catch {
          /* a non-JSON data line is passed on as text */
        }
        onEvent({ id: event.id, type: event.type, data });
      }
    }
  }

  (async () => {
    while (!controller.signal.aborted) {
      try {
        await once();
      } catch (err) {
        if (controller.signal.aborted) break;
        if (err instanceof ApiError && err.status === 401) break;
      }
      if (controller.signal.aborted) break;
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 8000);
    }
    // Stopped by its page (which moved on): the next page sets the indicator itself.
    if (!controller.signal.aborted) onState("stopped");
  })();
  return () => controller.abort();
}
