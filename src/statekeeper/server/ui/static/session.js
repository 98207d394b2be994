// Sessions: the list, and one session's transcript drawn as the DAG it is (branches,
// forks into other sessions, compaction summaries and the entries they stand for,
// continuation links), messages coloured by category.

import { api, follow, query } from "./api.js";
import { layout, messageText } from "./dag.js";
import { announce, clear, h, keepFocus, pretty, problem, put, s, setLive, shortId, statusBadge, when } from "./dom.js";

const ROW = 60;
const LANE = 22;
const CATEGORIES = ["system", "context", "dialog", "system_output"];
const sessionLink = (id, text) => h("a", { href: `#/sessions/${encodeURIComponent(id)}`, class: text ? undefined : "id" }, text || id);

const POLL_MS = 5000; // sessions written outside a run make no event: look again this often

function sessionRow(x) {
  const links = [];
  if (x.continued_from) links.push("continues ", sessionLink(x.continued_from), " ");
  if (x.continued_to) links.push("continued in ", sessionLink(x.continued_to), " ");
  if (x.forked_from) links.push("fork of ", sessionLink(x.forked_from.session_id), ` #${x.forked_from.seq}`);
  return h("tr", { "data-session": x.session_id },
    h("td", { "data-label": "Session" }, sessionLink(x.session_id, x.session_id)),
    h("td", { "data-label": "Title" }, x.title || h("span", { class: "muted" }, "untitled")),
    h("td", { "data-label": "Agent" }, x.agent_id || "–"),
    h("td", { "data-label": "Messages", class: "num" }, String(x.message_count)),
    h("td", { "data-label": "Tokens", class: "num" }, String(x.total_tokens)),
    h("td", { "data-label": "Compactions", class: "num" }, String(x.compaction_count)),
    h("td", { "data-label": "Links" }, links.length ? links : h("span", { class: "muted" }, "–")),
    h("td", { "data-label": "Last active", class: "muted" }, when(x.last_active)));
}

/** The sessions, most recently active first, kept current: at once when a run writes
 * (the tenant's event stream), and every few seconds for other writers. */
export function renderSessions(main) {
  const body = h("tbody", {});
  const more = h("button", { type: "button", hidden: true }, "Load more");
  let items = [];
  let cursor = null;
  let timer = null;
  let poll = null;
  main.append(
    h("div", { class: "page-head" }, h("h1", {}, "Sessions")),
    h("div", { class: "card table-wrap" }, h("table", { class: "runs sessions" },
      h("caption", { class: "visually-hidden" }, "Sessions, most recently active first"),
      h("thead", {}, h("tr", {}, ["Session", "Title", "Agent", "Messages", "Tokens", "Compactions", "Links", "Last active"]
        .map((t) => h("th", { scope: "col" }, t)))),
      body)),
    more);

  function draw() {
    keepFocus(body, () => {
      clear(body).append(...items.map(sessionRow));
      if (!items.length) body.append(h("tr", {}, h("td", { colspan: "8", class: "muted empty" }, "No sessions yet.")));
    });
    more.hidden = !cursor;
  }

  async function load() {
    try {
      const page = await api("/sessions" + query({ limit: 100, cursor }));
      items = [...items, ...(page.items || [])];
      cursor = page.next_cursor;
      draw();
    } catch (err) {
      problem(main, err);
    }
  }

  // Read again as many sessions as are shown (newest first), so a session that became
  // the most recently active moves to the top and a new one appears.
  async function refresh() {
    try {
      const page = await api("/sessions" + query({ limit: Math.min(Math.max(items.length, 100), 500) }));
      const before = new Set(items.map((x) => x.session_id));
      items = page.items || [];
      cursor = page.next_cursor;
      draw();
      const fresh = items.filter((x) => !before.has(x.session_id));
      if (fresh.length) announce(`${fresh.length} new session(s)`);
    } catch (err) {
      if (err.status === 401) problem(main, err);
    }
  }

  more.addEventListener("click", load);
  load();
  const stop = follow({}, () => {
    clearTimeout(timer);
    timer = setTimeout(refresh, 200);
  }, (state) => {
    setLive(state);
    if (state === "live") refresh();
  });
  poll = setInterval(() => {
    if (document.visibilityState === "visible") refresh();
  }, POLL_MS);
  return () => {
    stop();
    clearTimeout(timer);
    clearInterval(poll);
  };
}

async function allEntries(id) {
  const items = [];
  let after = 0;
  for (let page = 0; page < 20; page += 1) {
    const got = await api(`/sessions/${encodeURIComponent(id)}/entries` + query({ after_seq: after, limit: 500 }));
    items.push(...(got.items || []));
    if (got.next_after_seq === null || got.next_after_seq === undefined) break;
    after = got.next_after_seq;
  }
  return items;
}

/** Sessions forked from this one (the fork points drawn on its rows). */
async function forksOf(id) {
  const found = [];
  let cursor = null;
  for (let page = 0; page < 5; page += 1) {
    const got = await api("/sessions" + query({ limit: 200, cursor }));
    found.push(...(got.items || []).filter((x) => x.forked_from && x.forked_from.session_id === id));
    cursor = got.next_cursor;
    if (!cursor) break;
  }
  return found;
}

const BY_NUMBER = { 1: "system", 2: "context", 3: "dialog", 4: "system_output" };
const BY_ROLE = { system: "system", tool: "system_output", user: "dialog", assistant: "dialog" };

/** An entry's message category: as the server names it (a name or the enum's number),
 * else the role's default, as the library derives it. */
export function category(entry) {
  const m = entry.message || {};
  const raw = entry.category ?? m.category;
  const c = raw === null || raw === undefined ? BY_ROLE[m.role] || "" : BY_NUMBER[raw] || String(raw).toLowerCase();
  return CATEGORIES.includes(c) ? c : "other";
}

function label(entry) {
  if (entry.kind === "compaction") return "summary";
  if (entry.kind === "message" && entry.message) {
    const marker = entry.message.metadata && entry.message.metadata["statekeeper.marker"];
    return marker ? String(marker) : entry.message.role;
  }
  return entry.kind;
}

function entryText(entry) {
  if (entry.message) return messageText(entry.message);
  if (entry.payload) return JSON.stringify(entry.payload);
  return "";
}

/** [[first, last], ...] runs of consecutive numbers in rows. */
function spans(rows) {
  const out = [];
  for (const r of [...rows].sort((p, q) => p - q)) {
    if (out.length && out[out.length - 1][1] === r - 1) out[out.length - 1][1] = r;
    else out.push([r, r]);
  }
  return out;
}

function graph(plan, width, extraTop) {
  const x = (seq) => 14 + plan.laneOf.get(seq) * LANE;
  const y = (seq) => extraTop + plan.rowOf.get(seq) * ROW + ROW / 2;
  const svg = s("svg", {
    class: "graph", width, height: extraTop + plan.rows.length * ROW, "aria-hidden": "true", focusable: "false",
  });
  for (const edge of plan.edges) {
    const xc = x(edge.to);
    const yc = y(edge.to);
    if (edge.from === null) {
      if (extraTop) svg.append(s("path", { class: "edge", d: `M14 ${extraTop / 2} C14 ${yc - ROW / 2} ${xc} ${yc - ROW / 2} ${xc} ${yc}` }));
      continue;
    }
    const xp = x(edge.from);
    const yp = y(edge.from);
    const d = xp === xc ? `M${xp} ${yp} L${xc} ${yc}`
      : `M${xp} ${yp} C${xp} ${yp + ROW * 0.6} ${xc} ${yp + ROW * 0.4} ${xc} ${yp + ROW} L${xc} ${yc}`;
    const on = plan.byseq.get(edge.to).on_branch;
    svg.append(s("path", { class: `edge${on ? " on" : ""}`, d }));
  }
  // A compaction's bracket spans the entries its summary stands for.
  let k = 0;
  for (const e of plan.rows) {
    const covered = (e.covers || []).filter((seq) => plan.rowOf.has(seq));
    if (e.kind !== "compaction" || !covered.length) continue;
    const bx = 14 + plan.lanes * LANE + 6 + k * 8;
    k += 1;
    // One bracket per run of adjacent rows, so entries of other branches in between
    // are not drawn as covered.
    for (const [first, last] of spans(covered.map((seq) => plan.rowOf.get(seq)))) {
      const top = extraTop + first * ROW + 8;
      const bottom = extraTop + last * ROW + ROW - 8;
      const mid = (top + bottom) / 2;
      svg.append(
        s("path", { class: "bracket", d: `M${bx - 5} ${top} L${bx} ${top} L${bx} ${bottom} L${bx - 5} ${bottom}` }),
        s("path", { class: "bracket link", d: `M${bx} ${mid} C${bx + 12} ${mid} ${bx + 12} ${y(e.seq)} ${x(e.seq) + 7} ${y(e.seq)}` }));
    }
  }
  if (extraTop) svg.append(s("circle", { class: "dot origin", cx: 14, cy: extraTop / 2, r: 5.5 }));
  for (const e of plan.rows) {
    const shape = e.kind === "compaction"
      ? s("rect", { x: x(e.seq) - 6, y: y(e.seq) - 6, width: 12, height: 12, transform: `rotate(45 ${x(e.seq)} ${y(e.seq)})` })
      : s("circle", { cx: x(e.seq), cy: y(e.seq), r: 5.5 });
    shape.setAttribute("class", `dot cat-${category(e)}${e.on_branch ? " on" : ""}${e.kind === "compaction" ? " summary" : ""}`);
    svg.append(shape);
  }
  return svg;
}

function details(panel, entry, session, plan) {
  const fork = h("button", { type: "button" }, "Fork a new session here");
  fork.addEventListener("click", async () => {
    fork.disabled = true;
    try {
      const made = await api(`/sessions/${encodeURIComponent(session.session_id)}/fork`, { method: "POST", body: { at: entry.seq } });
      announce(`Forked into ${made.session_id}`);
      window.location.hash = `#/sessions/${encodeURIComponent(made.session_id)}`;
    } catch (err) {
      problem(panel, err);
      fork.disabled = false;
    }
  });
  const m = entry.message || {};
  const calls = Array.isArray(m.content) ? m.content.filter((b) => b && b.type === "tool_call") : [];
  put(clear(panel), 
    h("h2", { id: "detail-title" }, `#${entry.seq} · ${label(entry)}`),
    h("p", { class: "muted" }, `${entry.kind} · ${category(entry).replace("_", " ")} · ${when(entry.created_at)}`,
      entry.on_branch ? " · on the active branch" : " · on another branch"),
    entry.kind === "compaction" && entry.covers && entry.covers.length
      ? h("p", {}, `Stands for ${entry.covers.length} entries: `, entry.covers.map((seq) => `#${seq}`).join(", "), ".")
      : null,
    plan.coveredBy.has(entry.seq) ? h("p", { class: "notice" }, `Summarised by #${plan.coveredBy.get(entry.seq)}; still stored and readable.`) : null,
    h("div", { class: "fulltext" }, entryText(entry) || h("span", { class: "muted" }, "(no text)")),
    calls.length ? [h("h3", {}, "Tool calls"), calls.map((c) => h("pre", { class: "args" }, `${c.name} ${pretty(c.arguments)}`))] : null,
    h("details", {}, h("summary", {}, "Stored entry (JSON)"), h("pre", {}, pretty(entry))),
    entry.kind !== "compaction" && entry.kind !== "checkpoint" ? fork : null,
  );
}

function legend() {
  return h("ul", { class: "legend", "aria-label": "Legend" },
    CATEGORIES.map((c) => h("li", {}, h("span", { class: `swatch cat-${c}` }), c.replace("_", " "))),
    h("li", {}, h("span", { class: "swatch summary" }), "compaction summary"),
    h("li", {}, h("span", { class: "swatch off" }), "other branch"));
}

function rowCard(e, plan, forks, select) {
  const chips = [];
  // Side entries (a run's checkpoints) as one chip per kind: "◆ checkpoint ×3".
  const sides = new Map();
  for (const side of plan.attached.get(e.seq) || []) sides.set(side.kind, (sides.get(side.kind) || 0) + 1);
  for (const [kind, count] of sides) {
    chips.push(h("span", { class: "chip", title: `${count} ${kind} entr${count > 1 ? "ies" : "y"} written after #${e.seq}` },
      `◆ ${kind}${count > 1 ? ` ×${count}` : ""}`));
  }
  if (plan.coveredBy.has(e.seq)) chips.push(h("span", { class: "chip" }, `in summary #${plan.coveredBy.get(e.seq)}`));
  if (e.kind === "compaction") chips.push(h("span", { class: "chip summary" }, `stands for ${(e.covers || []).length}`));
  const forkLinks = forks.filter((f) => f.forked_from.seq === e.seq).map((f) =>
    h("a", { class: "chip fork", href: `#/sessions/${encodeURIComponent(f.session_id)}`, title: f.session_id },
      `↳ fork ${f.title ? `“${f.title}”` : shortId(f.session_id)}`));
  const text = entryText(e);
  const classes = ["node", `cat-${category(e)}`, e.on_branch ? "on" : "off", `kind-${e.kind}`];
  if (plan.coveredBy.has(e.seq)) classes.push("covered");
  // Its name is what it shows (entry, role, text), with the category for screen readers.
  const button = h("button", { type: "button", class: "node-main" },
    h("span", { class: "seq" }, `#${e.seq}`),
    h("span", { class: "role" }, label(e), h("span", { class: "visually-hidden" }, ` (${category(e).replace("_", " ")}) `)),
    h("span", { class: "text" }, text.slice(0, 240)));
  button.addEventListener("click", () => select(e, button));
  return h("div", {
    class: classes.join(" "), "data-seq": String(e.seq),
    style: { top: `${plan.extraTop + plan.rowOf.get(e.seq) * ROW}px`, left: `${plan.graphWidth}px` },
  }, button, chips.length || forkLinks.length ? h("span", { class: "chips" }, chips, forkLinks) : null);
}

export function renderSession(main, id) {
  (async () => {
    try {
      const [session, entries, forks] = await Promise.all([
        api(`/sessions/${encodeURIComponent(id)}`), allEntries(id), forksOf(id).catch(() => [])]);
      drawSession(main, session, entries, forks);
    } catch (err) {
      problem(main, err);
    }
  })();
}

function drawSession(main, session, entries, forks) {
  const plan = layout(entries);
  plan.byseq = new Map(entries.map((e) => [e.seq, e]));
  const compactions = plan.rows.filter((e) => e.kind === "compaction").length;
  plan.extraTop = session.forked_from ? ROW : 0;
  plan.graphWidth = 14 + plan.lanes * LANE + 8 + compactions * 8 + 14;
  const panel = h("aside", { class: "card detail", "aria-labelledby": "detail-title", "aria-live": "polite" },
    h("h2", { id: "detail-title" }, "Entry"), h("p", { class: "muted" }, "Choose an entry to read it in full."));
  let selected = null;
  const select = (entry, button) => {
    if (selected) selected.classList.remove("selected");
    selected = button.parentElement;
    selected.classList.add("selected");
    details(panel, entry, session, plan);
  };
  const canvas = h("div", {
    class: "dag", role: "list", "aria-label": "transcript entries in seq order",
    style: { height: `${plan.extraTop + plan.rows.length * ROW}px` },
  }, graph(plan, plan.graphWidth, plan.extraTop));
  if (session.forked_from) {
    canvas.append(h("div", { class: "node origin", style: { top: "0px", left: `${plan.graphWidth}px` } },
      h("span", { class: "text" }, "↱ history inherited from ",
        sessionLink(session.forked_from.session_id), ` up to entry #${session.forked_from.seq}`)));
  }
  for (const e of plan.rows) {
    const card = rowCard(e, plan, forks, select);
    card.setAttribute("role", "listitem");
    canvas.append(card);
  }
  const links = [];
  if (session.continued_from) links.push(h("p", { class: "link-card" }, "← continues ", sessionLink(session.continued_from)));
  const tail = session.continued_to ? h("p", { class: "link-card" }, "continued in ", sessionLink(session.continued_to), " →") : null;
  put(main,
    h("div", { class: "page-head" },
      h("div", {},
        h("p", { class: "crumbs" }, h("a", { href: "#/sessions" }, "Sessions"), " / ", session.session_id),
        h("h1", {}, session.title || "Untitled session"),
        h("p", { class: "muted" },
          `${session.agent_id || "no agent"} · ${session.message_count} messages · ${session.total_tokens} tokens · `,
          `${session.compaction_count} compaction(s) · ${plan.lanes} branch(es) · ${forks.length} fork(s) · last active ${when(session.last_active)}`)),
      legend()),
    runsLine(session),
    h("div", { class: "session-grid" },
      h("section", { class: "card", "aria-label": "transcript graph" }, links, entries.length || session.forked_from ? canvas : h("p", { class: "muted" }, "No entries yet."), tail),
      panel));
}

function runsLine(session) {
  const runs = session.runs || [];
  if (!runs.length) return null;
  return h("p", { class: "runs-line" }, "Runs on this session: ", runs.map((r) => h("span", { class: "run-ref" },
    h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, class: "id" }, r.run_id), " ", statusBadge(r.status))));
}
