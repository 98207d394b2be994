// The runs board: every run of the tenant, pending approvals first, updated live from the
// tenant's event stream (each event refreshes the run it names). Delegated runs sit under
// their parent; a filter (status, agent) or a search (id, agent, title) lists matches flat.

import { api, follow, query } from "./api.js";
import { announce, clear, h, keepFocus, money, problem, setLive, shortId, statusBadge, when } from "./dom.js";

const STATUSES = [
  "", "waiting_for_approval", "running", "waiting_for_input", "paused",
  "initializing", "completed", "error", "cancelled",
];
const MAX_PAGES = 20; // of 500 runs
const ACTIVE = new Set(["waiting_for_approval", "running", "waiting_for_input", "paused", "initializing"]);

/** Pending approvals first, then runs still going, then the most recently changed. */
export function boardOrder(a, b) {
  const pa = (a.pending_approvals || 0) > 0 ? 0 : 1;
  const pb = (b.pending_approvals || 0) > 0 ? 0 : 1;
  if (pa !== pb) return pa - pb;
  const aa = ACTIVE.has(a.status) ? 0 : 1;
  const ab = ACTIVE.has(b.status) ? 0 : 1;
  if (aa !== ab) return aa - ab;
  return String(b.updated_at || "").localeCompare(String(a.updated_at || ""));
}

function costCell(run) {
  const cost = Number(run.cost_usd || 0);
  if (run.budget_usd === null || run.budget_usd === undefined) {
    return h("td", { class: "num", "data-label": "Cost" }, money(cost), h("span", { class: "muted" }, " no budget"));
  }
  const budget = Number(run.budget_usd);
  const share = budget > 0 ? Math.min(cost / budget, 1) : 1;
  const level = share >= 0.9 ? "high" : share >= 0.6 ? "mid" : "low";
  return h("td", { class: "num", "data-label": "Cost" },
    h("span", {}, `${money(cost)} / ${money(budget)}`),
    h("span", {
      class: `bar bar-${level}`, role: "meter", "aria-valuemin": "0", "aria-valuemax": String(budget),
      "aria-valuenow": String(cost), "aria-label": `cost ${money(cost)} of budget ${money(budget)}`,
    }, h("span", { style: { width: `${Math.round(share * 100)}%` } })),
  );
}

/** Runs in board order with each run's delegated runs right under it (any depth). A run
 * whose parent is not on the board stands at the top level. */
export function grouped(runs) {
  const byId = new Map(runs.map((r) => [r.run_id, r]));
  const children = new Map();
  for (const run of runs) {
    const parent = run.parent_run_id && byId.has(run.parent_run_id) ? run.parent_run_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(run);
  }
  // A group goes where its most urgent member would: a child waiting for a person lifts
  // its parent's group to the top.
  const lead = new Map();
  const leadOf = (run) => {
    if (!lead.has(run.run_id)) {
      const kids = (children.get(run.run_id) || []).map(leadOf);
      lead.set(run.run_id, [run, ...kids].sort(boardOrder)[0]);
    }
    return lead.get(run.run_id);
  };
  const out = [];
  const walk = (parent, depth) => {
    const kids = [...(children.get(parent) || [])];
    kids.sort((a, b) => boardOrder(leadOf(a), leadOf(b)));
    for (const run of kids) {
      out.push({ run, depth });
      walk(run.run_id, depth + 1);
    }
  };
  walk(null, 0);
  return out;
}

/** Whether a run matches the search text: its id, its session's id, agent or title. */
export function matches(run, text) {
  if (!text) return true;
  const needle = text.toLowerCase();
  return [run.run_id, run.session_id, run.agent, run.title, run.parent_run_id]
    .some((v) => v && String(v).toLowerCase().includes(needle));
}

function row({ run, depth }) {
  const pending = run.pending_approvals || 0;
  const link = `#/runs/${encodeURIComponent(run.run_id)}`;
  const classes = [pending ? "needs-you" : "", depth ? "child" : ""].filter(Boolean).join(" ");
  return h("tr", { "data-run": run.run_id, "data-depth": String(depth), class: classes },
    h("td", { "data-label": "Status" }, statusBadge(run.status),
      run.stopped && run.stopped.kind !== "approval" ? h("span", { class: "why" }, run.stopped.text) : ""),
    h("td", { "data-label": "Run", class: "run-cell", style: depth ? { paddingLeft: `${10 + depth * 18}px` } : undefined },
      depth ? h("span", { class: "muted", "aria-hidden": "true" }, "↳ ") : "",
      h("a", { href: link, class: "id" }, run.run_id),
      run.title ? h("span", { class: "run-title" }, run.title) : "",
      depth ? h("span", { class: "visually-hidden" }, ` delegated by ${run.parent_run_id}`) : ""),
    h("td", { "data-label": "Agent" }, run.agent || "–"),
    h("td", { "data-label": "Step", class: "num" }, String(run.step ?? 0)),
    costCell(run),
    h("td", { "data-label": "Approvals" }, pending
      ? h("a", { class: "badge pending", href: link, "aria-label": `${pending} to review: pending approval(s) of ${run.run_id}` },
        `${pending} to review`)
      : h("span", { class: "muted" }, "–")),
    h("td", { "data-label": "Session" }, run.session_id
      ? h("a", { href: `#/sessions/${encodeURIComponent(run.session_id)}`, class: "id" }, run.session_id)
      : "–"),
    h("td", { "data-label": "Updated", class: "muted" }, h("time", { datetime: run.updated_at || "" }, when(run.updated_at))),
  );
}

/** The "New run" form: the app's agents, an input, an optional title; Start posts the
 * run and opens its page. `agents` is GET /agents (a server without --app has none). */
function newRunForm(agents) {
  const agent = h("select", { id: "new-agent", required: true },
    agents.map((a) => h("option", { value: a.name }, a.description ? `${a.name} — ${a.description}` : a.name)));
  const input = h("textarea", { id: "new-input", rows: "3", required: true, autocomplete: "off" });
  const title = h("input", { id: "new-title", type: "text", autocomplete: "off", placeholder: "optional" });
  const steps = h("input", { id: "new-steps", type: "number", min: "1", step: "1", placeholder: "default", class: "narrow" });
  const budget = h("input", { id: "new-budget", type: "number", min: "0", step: "any", placeholder: "default", class: "narrow" });
  const go = h("button", { type: "submit", class: "primary" }, "Start");
  const form = h("form", { class: "card new-run", id: "new-run", "aria-labelledby": "new-run-title", hidden: true },
    h("h2", { id: "new-run-title" }, "New run"),
    h("div", { class: "new-run-fields" },
      h("label", { for: "new-agent" }, "Agent to run", agent),
      h("label", { for: "new-title" }, "Title", title),
      h("label", { for: "new-steps" }, "Most steps", steps),
      h("label", { for: "new-budget" }, "Budget", budget)),
    h("label", { for: "new-input" }, "Input"), input,
    h("div", { class: "followup-actions" }, go));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!input.value.trim()) {
      input.focus();
      return;
    }
    go.disabled = true;
    try {
      const limits = {};
      if (steps.value) limits.iterations = Number(steps.value);
      if (budget.value) limits.budget = Number(budget.value);
      const body = { agent: agent.value, input: input.value, title: title.value || undefined };
      if (Object.keys(limits).length) body.limits = limits;
      const run = await api("/runs", { method: "POST", body });
      announce(`Started run ${shortId(run.run_id)}`);
      window.location.hash = `#/runs/${encodeURIComponent(run.run_id)}`;
    } catch (err) {
      form.querySelector(".error")?.remove();
      problem(form, err);
      go.disabled = false;
    }
  });
  return { form, first: agent };
}

export function renderBoard(main) {
  const runs = new Map();
  const timers = new Map();
  let filter = "";
  let agentFilter = "";
  let search = "";
  let truncated = false;
  const select = h("select", { id: "status-filter" },
    STATUSES.map((s) => h("option", { value: s }, s ? s.replaceAll("_", " ") : "all statuses")));
  const agents = h("select", { id: "agent-filter" }, h("option", { value: "" }, "all agents"));
  const searchBox = h("input", {
    id: "run-search", type: "search", placeholder: "id, agent or title", autocomplete: "off",
  });
  const body = h("tbody", {});
  const counts = h("p", { class: "muted", id: "board-counts" });
  const table = h("table", { class: "runs", "aria-describedby": "board-counts" },
    h("caption", { class: "visually-hidden" }, "Runs, pending approvals first"),
    h("thead", {}, h("tr", {},
      ["Status", "Run", "Agent", "Step", "Cost / budget", "Approvals", "Session", "Updated"]
        .map((t) => h("th", { scope: "col" }, t)))),
    body);
  const newRun = h("button", { type: "button", id: "new-run-open", class: "primary", hidden: true,
    "aria-expanded": "false" }, "New run");
  const formSlot = h("div", {});
  main.append(
    h("div", { class: "page-head" },
      h("div", { class: "board-title" }, h("h1", {}, "Runs"), newRun),
      h("div", { class: "filters", role: "search", "aria-label": "Filter runs" },
        h("label", { for: "run-search" }, "Search ", searchBox),
        h("label", { for: "status-filter" }, "Status ", select),
        h("label", { for: "agent-filter" }, "Agent ", agents))),
    formSlot,
    counts,
    h("div", { class: "card table-wrap" }, table),
  );

  // Offered only when the server can run agents (it has an --app).
  api("/agents").then(({ items }) => {
    if (!items || !items.length) return;
    newRun.hidden = false;
    let made = null; // built when first opened: the board stays as it was until then
    newRun.addEventListener("click", () => {
      if (!made) {
        made = newRunForm(items);
        formSlot.append(made.form);
        newRun.setAttribute("aria-controls", "new-run");
      }
      made.form.hidden = !made.form.hidden;
      newRun.setAttribute("aria-expanded", String(!made.form.hidden));
      if (!made.form.hidden) made.first.focus();
    });
  }, () => {});

  function drawAgents() {
    const names = [...new Set([...runs.values()].map((r) => r.agent).filter(Boolean))].sort();
    const have = [...agents.options].slice(1).map((o) => o.value);
    if (names.join("\n") === have.join("\n")) return;
    const chosen = agents.value;
    clear(agents).append(h("option", { value: "" }, "all agents"),
      ...names.map((n) => h("option", { value: n }, n)));
    agents.value = names.includes(chosen) ? chosen : "";
  }

  function draw() {
    drawAgents();
    const narrowed = Boolean(filter || agentFilter || search);
    const picked = [...runs.values()].filter((r) => (!filter || r.status === filter)
      && (!agentFilter || r.agent === agentFilter) && matches(r, search));
    // Narrowed, the matches stand alone (a child's parent may not match); else the tree.
    const shown = narrowed ? picked.sort(boardOrder).map((run) => ({ run, depth: 0 })) : grouped(picked);
    keepFocus(body, () => {
      clear(body).append(...shown.map(row));
      if (!shown.length) {
        body.append(h("tr", {}, h("td", { colspan: "8", class: "muted empty" },
          narrowed ? "No run matches." : "No runs yet. Start one here (New run), with the library, the CLI or the API.")));
      }
    });
    const waiting = [...runs.values()].filter((r) => (r.pending_approvals || 0) > 0).length;
    counts.textContent = (narrowed ? `${shown.length} of ` : "") + `${runs.size} run(s); ${waiting} waiting for approval.`
      + (truncated ? ` Only the oldest ${MAX_PAGES * 500} runs and every run waiting for approval are read.` : "");
  }

  // The API lists runs oldest first: read every page (up to MAX_PAGES), and the runs
  // waiting for approval on their own, so those are on the board however many runs exist.
  async function pages(status) {
    const found = [];
    let cursor;
    for (let n = 0; n < MAX_PAGES; n += 1) {
      const page = await api("/runs" + query({ status, cursor, limit: 500 }));
      found.push(...(page.items || []));
      cursor = page.next_cursor;
      if (!cursor) return { found, complete: true };
    }
    return { found, complete: false };
  }

  async function load() {
    try {
      const [all, waiting] = await Promise.all([pages(), pages("waiting_for_approval")]);
      runs.clear();
      for (const run of [...all.found, ...waiting.found]) runs.set(run.run_id, run);
      truncated = !all.complete;
      draw();
    } catch (err) {
      problem(main, err);
    }
  }

  async function refresh(runId) {
    try {
      const run = await api(`/runs/${encodeURIComponent(runId)}`);
      const before = runs.get(runId);
      runs.set(runId, run);
      draw();
      const tr = body.querySelector(`tr[data-run="${CSS.escape(runId)}"]`);
      if (tr) tr.classList.add("flash");
      if (!before) announce(`New run ${shortId(runId)}: ${run.status}`);
      else if (before.status !== run.status) announce(`Run ${shortId(runId)} is now ${run.status}`);
    } catch (err) {
      if (err.status === 404) {
        runs.delete(runId);
        draw();
      }
    }
  }

  select.addEventListener("change", () => {
    filter = select.value;
    draw();
  });
  agents.addEventListener("change", () => {
    agentFilter = agents.value;
    draw();
  });
  searchBox.addEventListener("input", () => {
    search = searchBox.value.trim();
    draw();
  });
  load();
  // A run's events come in bursts (a step writes several): refresh it once per burst.
  const stop = follow({}, (event) => {
    const runId = event.data && event.data.run_id;
    if (!runId) return;
    clearTimeout(timers.get(runId));
    timers.set(runId, setTimeout(() => refresh(runId), 120));
  }, (state) => {
    setLive(state);
    // The tenant stream carries what happens from now on: read the list again each time
    // it (re)connects, so a change between the first read and the stream is not missed.
    if (state === "live") load();
  });
  return () => {
    stop();
    for (const t of timers.values()) clearTimeout(t);
  };
}
