// A run's state at one checkpoint (#/runs/RUN/checkpoints/STEP): status, limits, metrics,
// the calls waiting there and the whole stored state; then "edit and rerun": change the
// state's editable fields (JSON), give new input, and fork a new run from this step.

import { api } from "./api.js";
import { clear, h, money, pretty, problem, runPath, statusBadge, when } from "./dom.js";


function limitsList(limits) {
  if (!limits.length) return h("p", { class: "muted" }, "No limits set.");
  return h("dl", { class: "pairs" }, limits.flatMap((l) => [
    h("dt", {}, l.name),
    h("dd", {}, `${l.current} of ${l.limit === null || l.limit === undefined ? "∞" : l.limit}`),
  ]));
}

function pendingList(pending) {
  if (!pending.length) return h("p", { class: "muted" }, "No call waits for a decision here.");
  return h("ul", { class: "plain" }, pending.map((c) => h("li", {},
    h("code", {}, c.tool), h("span", { class: "muted" }, ` · ${c.call_id}`),
    c.prompt ? h("div", {}, c.prompt) : null,
    h("pre", { class: "args" }, pretty(c.arguments)))));
}

/** The edit-and-rerun form: the editable fields as JSON, new input, and Fork. */
function editForm(cp, canRun) {
  const state = h("textarea", {
    id: "cp-state", rows: "12", spellcheck: "false", class: "json",
    "aria-describedby": "cp-state-help",
  });
  state.value = JSON.stringify(cp.editable, null, 2);
  const input = h("textarea", { id: "cp-input", rows: "2", placeholder: "optional" });
  const status = h("p", { role: "status", class: "muted", id: "cp-status" });
  const fork = h("button", { type: "submit", class: "primary" }, canRun ? "Fork and run" : "Fork");
  const form = h("form", { class: "card", "aria-labelledby": "edit-title" },
    h("h2", { id: "edit-title" }, "Edit and rerun from here"),
    h("label", { for: "cp-state" }, "State fields (JSON)"), state,
    h("p", { class: "muted", id: "cp-state-help" },
      `Changes apply to a new run forked at step ${cp.step}; this run stays as it is. `
      + `A fork gets its own ${cp.fixed.join(", ")}.`),
    h("label", { for: "cp-input" }, "New input for the fork"), input,
    h("div", { class: "actions" }, fork), status);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let update;
    try {
      update = JSON.parse(state.value);
      if (!update || typeof update !== "object" || Array.isArray(update)) throw new Error("not an object");
    } catch (err) {
      status.className = "error";
      status.textContent = `The state fields must be a JSON object (${err.message}): fix them and fork again.`;
      state.focus();
      return;
    }
    const changed = Object.fromEntries(Object.entries(update)
      .filter(([k, v]) => JSON.stringify(v) !== JSON.stringify(cp.editable[k])));
    fork.disabled = true;
    try {
      const body = { at: cp.step, state_update: Object.keys(changed).length ? changed : undefined };
      if (input.value.trim()) body.input = input.value;
      if (canRun) body.run = true;
      const made = await api(`${runPath(cp.run_id)}/fork`, { method: "POST", body });
      window.location.hash = `#${runPath(made.run_id)}`;
    } catch (err) {
      status.className = "error";
      status.textContent = err.type ? `${err.type}: ${err.message}` : String(err.message || err);
      fork.disabled = false;
    }
  });
  return form;
}

export function renderCheckpoint(main, runId, step) {
  (async () => {
    try {
      const [cp, who] = await Promise.all([
        api(`${runPath(runId)}/checkpoints/${encodeURIComponent(step)}`),
        api("/agents").catch(() => null),
      ]);
      clear(main).append(
        h("div", { class: "page-head" }, h("div", {},
          h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Runs"), " / ",
            h("a", { href: `#${runPath(runId)}` }, runId), ` / step ${cp.step}`),
          h("h1", {}, `Step ${cp.step} of ${cp.agent || "the run"} `, statusBadge(cp.status)),
          h("p", { class: "muted" }, `turn ${cp.turn ?? "?"} · checkpointed ${when(cp.at)} · `
            + `${cp.added.length} message(s) added · cost ${money(cp.metrics.cost_usd)}`))),
        h("div", { class: "run-grid" },
          h("div", {},
            editForm(cp, Boolean(who && who.items && who.items.length)),
            h("section", { class: "card", "aria-labelledby": "cp-whole-title" },
              h("h2", { id: "cp-whole-title" }, "The whole stored state"),
              h("pre", { class: "args tall" }, pretty(cp.state)))),
          h("div", {},
            h("section", { class: "card", "aria-labelledby": "cp-limits-title" },
              h("h2", { id: "cp-limits-title" }, "Limits"), limitsList(cp.limits),
              h("h2", {}, "Metrics"),
              h("dl", { class: "pairs" }, ["calls", "input_tokens", "output_tokens", "cost_usd"]
                .flatMap((k) => [h("dt", {}, k.replaceAll("_", " ")), h("dd", {}, String(cp.metrics[k]))]))),
            h("section", { class: "card", "aria-labelledby": "cp-pending-title" },
              h("h2", { id: "cp-pending-title" }, "Pending calls"), pendingList(cp.pending)))));
    } catch (err) {
      problem(main, err);
    }
  })();
}
