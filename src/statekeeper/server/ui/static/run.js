// A run: its pending tool calls (Approve / Reject), timeline of events with the
// conversation inline (convo.js), checkpoints with "fork from here", limits and metrics,
// error, and delegated children as a tree. It
// follows the run's own event stream and re-reads the run when events arrive.

import { ApiError, api, follow, query } from "./api.js";
import { namedMessages, placeMessages, runMessages, timelineFilters } from "./convo.js";
import { editedText, pendingCard } from "./decide.js";
import {
  announce, author, authorOf, clear, h, keepFocus, money, pretty, problem, put, runPath, setLive, shortId,
  statusBadge, typingIn, when,
} from "./dom.js";

const TERMINAL = new Set(["completed", "error", "cancelled"]);
const FOLLOWED = {
  steered: "Steered: the run reads your message at its next step.",
  queued: "Queued: the run goes on with your message once it stops.",
  deduplicated: "Already queued: the same message is waiting.",
  dropped: "Dropped: the run's follow-up queue is full.",
  resumed: "Sent: the run resumed with your message.",
  forked: "The finished run goes on in a new run with your message.",
};

/** One line saying what an event is about. */
export function eventSummary(event) {
  const data = event.data && typeof event.data === "object" ? event.data : {};
  const d = data.data && typeof data.data === "object" ? data.data : data.payload || data;
  const parts = [];
  if (d.agent && !d.text) parts.push(`agent ${d.agent}`); // who starts or takes over
  if (d.status) parts.push(String(d.status).replaceAll("_", " "));
  if (d.tool) parts.push(String(d.tool));
  if (d.call_id) parts.push(`call ${d.call_id}`);
  if (d.text) parts.push(String(d.text).slice(0, 160));
  const type = eventType(event);
  // A runner's events name the step's messages instead of repeating their text: the
  // timeline shows those messages under the event (convo.js).
  if (d.message && !(type === "tool/result" && d.output === undefined)) parts.push(String(d.message).slice(0, 160));
  if (d.always) parts.push("always");
  if (editedText(d)) parts.push(editedText(d));
  if (d.reason) parts.push(`reason: ${d.reason}`);
  if (d.decided_by) parts.push(`by ${authorOf(d.decided_by).name}`);
  return parts.join(" · ");
}

function eventType(event) {
  const data = event.data && typeof event.data === "object" ? event.data : {};
  return String(data.type || event.type || "event");
}

function limitsTable(run, act) {
  const limits = run.limits || [];
  if (!limits.length) return h("p", { class: "muted" }, "No limits set.");
  // The API raises a stopped run's limits only: not a finished one's, not while a process
  // drives the run (its next checkpoint would undo it), and never an unlimited one.
  const going = run.status === "running" || run.status === "initializing";
  const raising = !TERMINAL.has(run.status) && !going
    && limits.some((l) => l.limit !== null && l.limit !== undefined);
  const table = h("table", { class: "compact" },
    h("thead", {}, h("tr", {}, ["Limit", "Used", "Max", raising ? "Raise to" : null].filter(Boolean)
      .map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, limits.map((lim) => {
      const over = lim.limit !== null && lim.limit !== undefined && Number(lim.current) >= Number(lim.limit);
      const cells = [
        h("th", { scope: "row" }, lim.name),
        h("td", { class: "num" }, fmt(lim.current)),
        h("td", { class: "num" }, lim.limit === null || lim.limit === undefined ? "∞" : fmt(lim.limit)),
      ];
      if (raising && (lim.limit === null || lim.limit === undefined)) {
        cells.push(h("td", { class: "muted" }, "unlimited"));
      } else if (raising) {
        const input = h("input", {
          type: "number", min: "0", step: "any", class: "narrow", "aria-label": `new maximum for ${lim.name}`,
        });
        const raise = h("button", { type: "button", "aria-label": `Raise ${lim.name}` }, "Raise");
        raise.addEventListener("click", () => {
          if (input.value) act("limits", { name: lim.name, limit: Number(input.value) }, [raise]);
        });
        cells.push(h("td", {}, input, " ", raise));
      }
      return h("tr", { class: over ? "over" : "" }, cells);
    })));
  return going ? h("div", {}, table, h("p", { class: "muted", id: "raise-later" }, "Limits can be raised once the run stops.")) : table;
}

/** The limit a run stopped at, if any (its name). */
export function atLimit(run) {
  const lim = (run.limits || []).find((l) => l.limit !== null && l.limit !== undefined
    && Number(l.current) >= Number(l.limit));
  return lim ? lim.name : null;
}

/** Why Resume cannot be used now (null: it can). */
export function resumeBlocked(run, canRun) {
  if (!canRun) return "This server has no --app to run agents: resume the run from a worker.";
  if (run.status === "running" || run.status === "initializing") return "The run is running.";
  if ((run.pending || []).length || run.status === "waiting_for_approval") {
    return "A tool call waits for a decision: approve or reject it, and the run goes on.";
  }
  if (run.status === "waiting_for_input") return "The run waits for input: send it a follow-up below.";
  const limit = atLimit(run);
  if (limit) return `The run is at its ${limit} limit: raise it first (Limits).`;
  return null;
}

function fmt(value) {
  const n = Number(value);
  return Number.isInteger(n) ? String(n) : Number.isFinite(n) ? n.toFixed(4) : String(value);
}

function metricsList(metrics) {
  const rows = Object.entries(metrics || {}).filter(([, v]) => v !== null && typeof v !== "object");
  const nested = Object.entries(metrics || {}).filter(([, v]) => v !== null && typeof v === "object");
  if (!rows.length && !nested.length) return h("p", { class: "muted" }, "No metrics yet.");
  return h("div", {},
    h("dl", { class: "pairs" }, rows.flatMap(([k, v]) => [h("dt", {}, k.replaceAll("_", " ")), h("dd", {}, fmt(v))])),
    nested.length ? h("details", {}, h("summary", {}, "Per model and usage"), h("pre", {}, pretty(Object.fromEntries(nested)))) : null);
}

function childTree(children) {
  if (!children || !children.length) return null;
  return h("ul", { class: "tree" }, children.map((c) => h("li", {},
    h("a", { href: `#${runPath(c.run_id)}`, class: "id" }, c.run_id), " ",
    statusBadge(c.status), " ", h("span", { class: "muted" }, `${c.agent || ""} · step ${c.step ?? 0} · ${money(c.cost_usd)}`),
    childTree(c.children))));
}

/** Decisions from the run's approval events (kept for good), else from its state (kept
 * only until the run settles them). */
function decisionsList(logged, pending) {
  const decisions = logged.length ? logged : pending || [];
  if (!decisions.length) return h("p", { class: "muted" }, "No decisions yet.");
  return h("ul", { class: "plain" }, decisions.map((d) => h("li", {},
    h("span", { class: `badge ${d.approved ? "ok" : "no"}` }, d.approved ? "approved" : "rejected"), " ",
    h("code", {}, d.tool || d.call_id), d.always ? " (always)" : "",
    h("span", { class: "muted" }, " by ", author(d.decided_by), ` ${when(d.decided_at || d.at)}`),
    editedText(d) ? h("div", { class: "edited" }, editedText(d)) : null,
    d.reason ? h("div", { class: "muted" }, `reason: ${d.reason}`) : null)));
}

function checkpointsTable(runId, items, act, canRun) {
  if (!items.length) return h("p", { class: "muted" }, "No checkpoints yet.");
  return h("div", { class: "scroll short" }, h("table", { class: "compact cps" },
    h("thead", {}, h("tr", {}, ["Step", "Status", "At", ""].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, items.flatMap((cp) => {
      const ref = cp.step ?? cp.seq;
      const corrupt = cp.status === "corrupt"; // nothing to fork from
      const fork = corrupt ? null : h("button", { type: "button", class: "small", "aria-label": `Fork a new run from step ${ref}` }, "Fork");
      if (fork) {
        fork.title = "Start a new run from this checkpoint (paused, for you to resume)";
        fork.addEventListener("click", () => act("fork", { at: ref }, [fork]));
      }
      const row = h("tr", { "data-seq": String(ref) },
        h("td", { class: "num", title: `turn ${cp.turn ?? "?"}` }, corrupt ? String(cp.step ?? "")
          : h("a", { href: `#${runPath(runId)}/checkpoints/${ref}`, "aria-label": `State at step ${ref}: view, edit and rerun` },
            String(cp.step ?? ""))),
        h("td", {}, statusBadge(cp.status)),
        h("td", { class: "muted" }, h("time", { datetime: cp.at || "" }, when(cp.at || cp.created_at))),
        h("td", { class: "cp-actions" }, fork, canRun && !corrupt ? forkWithInput(ref, act) : null));
      return [row];
    }))));
}

/** "With input…" next to a checkpoint's Fork: a text box and "Fork and run", which forks
 * the checkpoint into a new run that goes on at once with that input. */
function forkWithInput(ref, act) {
  const id = `fork-input-${ref}`;
  const input = h("input", { type: "text", id, autocomplete: "off", placeholder: "new input" });
  const go = h("button", { type: "submit", class: "small primary", "aria-label": `Fork and run from step ${ref}` }, "Fork and run");
  const form = h("form", { class: "fork-input", hidden: true },
    h("label", { for: id, class: "visually-hidden" }, `New input for a fork from step ${ref}`), input, go);
  const open = h("button", {
    type: "button", class: "small", "aria-expanded": "false", "aria-controls": `${id}-form`,
    "aria-label": `With input: fork from step ${ref} with new input`,
  }, "With input");
  form.id = `${id}-form`;
  open.title = "Fork this checkpoint into a new run that goes on with new input";
  open.addEventListener("click", () => {
    form.hidden = !form.hidden;
    open.setAttribute("aria-expanded", String(!form.hidden));
    if (!form.hidden) input.focus();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!input.value.trim()) return input.focus();
    act("fork", { at: ref, input: input.value, run: true }, [go, open]);
  });
  return h("span", { class: "fork-more" }, open, form);
}

function header(run, act, canRun) {
  const done = TERMINAL.has(run.status);
  const actions = [];
  if (!done) { // a finished run is neither resumed nor cancelled: it goes on in a fork
    const resume = h("button", { type: "button", id: "resume-run" }, "Resume");
    const blocked = resumeBlocked(run, canRun);
    if (blocked) {
      // Focusable, so the keyboard reaches the reason too; a click does nothing.
      resume.setAttribute("aria-disabled", "true");
      resume.title = blocked;
      resume.setAttribute("aria-describedby", "resume-why");
    }
    resume.addEventListener("click", () => {
      if (!resumeBlocked(run, canRun)) act("resume", {}, [resume]);
    });
    const cancel = h("button", { type: "button", class: "danger", id: "cancel-run" }, "Cancel run");
    cancel.addEventListener("click", () => act("cancel", {}, [cancel]));
    actions.push(resume, cancel, blocked ? h("span", { id: "resume-why", class: "visually-hidden" }, blocked) : null);
  }
  return h("div", { class: "page-head" },
    h("div", {},
      h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Runs"), " / ", run.run_id),
      h("h1", {}, `Run of ${run.agent || "agent"} `, statusBadge(run.status)),
      h("p", { class: "muted" },
        `step ${run.step ?? 0} · ${money(run.cost_usd)}`,
        run.budget_usd !== null && run.budget_usd !== undefined ? ` of ${money(run.budget_usd)}` : "",
        " · session ",
        h("a", { href: `#/sessions/${encodeURIComponent(run.session_id)}`, class: "id" }, run.session_id),
        run.parent_run_id ? [" · child of ", h("a", { href: `#${runPath(run.parent_run_id)}`, class: "id" }, run.parent_run_id)] : "",
        run.forked_from ? [" · forked from ", h("a", { href: `#${runPath(run.forked_from.run_id)}`, class: "forked-from" },
          run.forked_from.run_id), ` at step ${run.forked_from.step}`] : "",
        ` · updated ${when(run.updated_at)}`)),
    h("div", { class: "actions" }, actions));
}

/** What the follow-up box offers for a run's status: its buttons (label, mode, hint) or
 * why it cannot take a follow-up now. */
export function followupOffer(run, owner) {
  const status = run.status;
  if ((run.pending || []).length || status === "waiting_for_approval") {
    return { blocked: "A tool call waits for a decision: approve or reject it first; a message now would land between the call and its result." };
  }
  if (status === "running" || status === "initializing") {
    if (run.owner && owner && run.owner !== owner) {
      return { blocked: `Another process (${run.owner}) drives this run: only it can take a follow-up now. Cancel it, or send one when it stops.` };
    }
    return {
      hint: "Steer: the run reads it at its next step. Queue: it goes on with it once it stops.",
      buttons: [["Steer", "steer", "primary"], ["Queue", "queue", ""]],
    };
  }
  const limit = atLimit(run);
  if (limit && !TERMINAL.has(status)) return { blocked: `The run is at its ${limit} limit: raise it first (Limits), then send.` };
  if (TERMINAL.has(status)) {
    return { hint: "The run is finished: its last checkpoint is forked into a new run that goes on with your message.", buttons: [["Continue in a new run", "queue", "primary"]] };
  }
  return { hint: "The run is stopped: it resumes with your message as its input.", buttons: [["Send", "steer", "primary"]] };
}

export function renderRun(main, runId) {
  const seen = new Set();
  const messages = new Map(); // the conversation: message id -> entry
  const shownMessages = new Set();
  const decided = []; // approval events: who decided which call
  const timeline = h("ol", { class: "timeline", "aria-label": "events, oldest first" });
  const timelineBox = h("div", { class: "scroll tall", tabindex: "0", "aria-label": "timeline" }, timeline);
  const filters = timelineFilters(timeline);
  const top = h("div", {});
  const side = h("div", { class: "side" });
  const pendingBox = h("section", { "aria-labelledby": "pending-title" });
  const followBox = h("section", { class: "card followup", "aria-labelledby": "followup-title", hidden: true });
  const followText = h("textarea", { id: "followup-text", rows: "2", autocomplete: "off", "aria-describedby": "followup-hint" });
  const followButtons = h("div", { class: "followup-actions" });
  const followHint = h("p", { class: "muted", id: "followup-hint" });
  followBox.append(h("h2", { id: "followup-title" }, "Follow-up"),
    h("label", { for: "followup-text" }, "Message to the run"), followText, followButtons, followHint);
  main.append(top, h("div", { class: "run-grid" },
    h("div", {}, pendingBox, followBox,
      h("section", { class: "card", "aria-labelledby": "timeline-title" },
        h("div", { class: "card-head" }, h("h2", { id: "timeline-title" }, "Timeline and conversation"),
          filters.controls), timelineBox)),
    side));
  let run = null;
  let canRun = false; // the server has an --app: it can run agents
  let serverOwner = null; // the lease owner of the runs it drives (and can steer)
  let followKey = null;
  let notice = "";
  let pendingKey = null;
  let timer = null;
  let closed = false;
  let stop = () => {};

  function addEvents(events) {
    const atBottom = timelineBox.scrollTop + timelineBox.clientHeight >= timelineBox.scrollHeight - 8;
    for (const ev of events) {
      const key = ev.id ?? `${eventType(ev)}:${ev.data && ev.data.seq}`;
      if (seen.has(String(key))) continue;
      seen.add(String(key));
      const data = ev.data || {};
      const type = eventType(ev);
      if (type.startsWith("approval/") && data.data) decided.push({ ...data.data, at: data.at });
      const names = namedMessages(data.data);
      timeline.append(h("li", {
        class: `ev ev-${type.split(/[/.:]/)[0]}`, "data-at": data.at || "", "data-type": type,
        "data-names": names.length ? names.join(" ") : undefined,
      },
        h("span", { class: "seq" }, `#${data.seq ?? ev.id ?? ""}`),
        h("span", { class: "etype" }, type),
        h("div", { class: "what" }, eventSummary(ev)),
        h("time", { class: "muted", datetime: data.at || "" }, when(data.at))));
    }
    placeMessages(timeline, messages, shownMessages);
    filters.update();
    if (atBottom) timelineBox.scrollTop = timelineBox.scrollHeight;
  }

  // A decision asks the server to resume the run once nothing is pending. A server started
  // without --app cannot run agents: then the decision is recorded alone, and the run
  // waits for a worker that resumes it (the page says so).
  async function post(action, body) {
    const path = `${runPath(runId)}/${action}`;
    if (action !== "approve" && action !== "reject") return api(path, { method: "POST", body });
    try {
      return await api(path, { method: "POST", body: { ...body, resume: true } });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 422 || !/--app/.test(err.message)) throw err;
      const result = await api(path, { method: "POST", body: { ...body, resume: false } });
      notice = "Decision recorded. This server has no --app to run the agent: resume the run from a worker.";
      return result;
    }
  }

  // The run's log so far, page by page (up to 5,000 events; the stream goes on from there).
  async function allEvents() {
    const items = [];
    let after;
    for (let n = 0; n < 5; n += 1) {
      const page = await api(`${runPath(runId)}/events` + query({ after, limit: 1000 }));
      items.push(...(page.items || []));
      if (page.next_after === null || page.next_after === undefined) break;
      after = page.next_after;
    }
    return items;
  }

  // A fork that is to run at once from a checkpoint at a limit would stop before its
  // first step (the fork API creates it anyway): refused here, saying what works.
  async function checkForkRoom(body) {
    const cp = await api(`${runPath(runId)}/checkpoints/${body.at}`).catch(() => null);
    if (!cp || cp.status === "waiting_for_approval") return;
    const full = (cp.limits || []).find((l) => l.limit !== null && l.limit !== undefined
      && Number(l.current) >= Number(l.limit));
    if (full) {
      throw new ApiError(409, "LimitReachedError", `step ${body.at} is at its ${full.name} limit `
        + `(${fmt(full.current)} of ${fmt(full.limit)}), so a fork of it cannot run: use Fork (the new run `
        + "waits, paused), raise its limit there, then resume it; or fork an earlier step");
    }
  }

  async function act(action, body, buttons) {
    for (const b of buttons) b.disabled = true;
    try {
      if (action === "fork" && body.run) await checkForkRoom(body);
      const result = await post(action, body);
      announce(`${action} done for run ${shortId(runId)}`);
      if (action === "followups" && result) {
        followText.value = "";
        for (const b of buttons) b.disabled = false; // kept when the offer is the same
        notice = FOLLOWED[result.outcome] || `Follow-up ${result.outcome}.`;
        announce(notice);
      }
      if ((action === "fork" || action === "followups") && result && result.run_id && result.run_id !== runId) {
        window.location.hash = `#${runPath(result.run_id)}`;
        return;
      }
      await refresh();
    } catch (err) {
      problem(top, err).scrollIntoView({ block: "nearest" });
      for (const b of buttons) b.disabled = false;
    }
  }

  // The follow-up box keeps its text box (and what is typed) across live updates; its
  // buttons change with what the run can take now.
  function drawFollowup() {
    followBox.hidden = !canRun;
    if (!canRun) return;
    const offer = followupOffer(run, serverOwner);
    const key = JSON.stringify(offer);
    if (key === followKey) return;
    followKey = key;
    keepFocus(followButtons, () => {
      clear(followButtons);
      followText.disabled = Boolean(offer.blocked);
      followHint.textContent = offer.blocked || offer.hint;
      const buttons = (offer.buttons || []).map(([label, mode, cls]) => {
        const b = h("button", { type: "button", class: cls || undefined, "data-mode": mode }, label);
        b.addEventListener("click", () => {
          if (!followText.value.trim()) {
            followText.focus();
            return;
          }
          act("followups", { text: followText.value, mode }, buttons);
        });
        return b;
      });
      followButtons.append(...buttons);
    });
  }

  function draw() {
    drawFollowup();
    keepFocus(top, () => drawTop());
    // The pending cards are redrawn only when the calls change, so a reason being typed
    // survives the live updates of a run that goes on.
    const pending = run.pending || [];
    const key = pending.map((call) => call.call_id).join("\n");
    if (key === pendingKey && pendingBox.firstChild) return;
    pendingKey = key;
    keepFocus(pendingBox, () => clear(pendingBox).append(pending.length
      ? h("div", { class: "card attention" },
        h("h2", { id: "pending-title" }, `Waiting for approval (${pending.length})`),
        pending.map((call) => pendingCard(run, call, act)))
      : h("h2", { id: "pending-title", class: "visually-hidden" }, "No pending approvals")));
  }

  function drawTop() {
    clear(top).append(header(run, act, canRun));
    if (run.stopped && run.stopped.kind !== "error") {
      top.append(h("p", { class: `why-card stop-${run.stopped.kind}`, id: "why-stopped" },
        h("strong", {}, "Why it stopped: "), run.stopped.text));
    }
    if (notice) top.append(h("p", { class: "notice", role: "status" }, notice));
    if (run.output !== null && run.output !== undefined) {
      top.append(h("details", { class: "card output", open: true }, h("summary", {}, "Output"), h("pre", {}, pretty(run.output))));
    }
    if (run.error) top.append(h("div", { class: "error card", role: "alert" }, h("h2", {}, "Error"), h("pre", {}, String(run.error))));
  }

  async function drawSide() {
    const checkpoints = await api(`${runPath(runId)}/checkpoints`).catch(() => ({ items: [] }));
    if (typingIn(side)) return; // a new limit being typed: the next update redraws
    keepFocus(side, () => put(clear(side),
      h("section", { class: "card", "aria-labelledby": "limits-title" },
        h("h2", { id: "limits-title" }, "Limits"), limitsTable(run, act),
        h("h2", {}, "Metrics"), metricsList(run.metrics)),
      h("section", { class: "card", "aria-labelledby": "cp-title" },
        h("h2", { id: "cp-title" }, "Checkpoints"), checkpointsTable(runId, checkpoints.items || [], act, canRun)),
      h("section", { class: "card", "aria-labelledby": "children-title" },
        h("h2", { id: "children-title" }, "Delegated runs"),
        childTree(run.children) || h("p", { class: "muted" }, "No child runs.")),
      h("section", { class: "card", "aria-labelledby": "decisions-title" },
        h("h2", { id: "decisions-title" }, "Decisions"), decisionsList(decided, run.decisions))));
  }

  async function refresh() {
    run = await api(runPath(runId));
    draw();
    await loadMessages();
    await drawSide();
  }

  async function loadMessages() {
    const atBottom = timelineBox.scrollTop + timelineBox.clientHeight >= timelineBox.scrollHeight - 8;
    for (const [id, entry] of await runMessages(run).catch(() => new Map())) messages.set(id, entry);
    placeMessages(timeline, messages, shownMessages);
    filters.update();
    if (atBottom) timelineBox.scrollTop = timelineBox.scrollHeight;
  }

  (async () => {
    try {
      const app = await api("/agents").catch(() => null);
      canRun = Boolean(app);
      serverOwner = app && app.owner;
      const items = await allEvents();
      addEvents(items.map((e) => ({ id: e.id === undefined ? null : String(e.id), type: e.type, data: e })));
      await refresh();
      const last = items.length ? items[items.length - 1].id : null;
      if (closed) return;
      stop = follow({ run_id: runId, last_event_id: last ?? undefined }, (ev) => {
        addEvents([ev]);
        clearTimeout(timer);
        timer = setTimeout(() => refresh().catch(() => {}), 120);
      }, setLive);
    } catch (err) {
      problem(main, err);
    }
  })();
  return () => {
    closed = true;
    stop();
    clearTimeout(timer);
  };
}
