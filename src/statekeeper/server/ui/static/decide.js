// Deciding a tool call a run waits on: the card of one pending call, with its tool, call
// id, the agent's prompt and arguments, and the decisions of an agent inbox: Approve;
// Edit arguments, then Approve with edits (the tool runs with the edited arguments);
// Reject with a message to the model (it gets it as the call's result); "always for this
// tool". `act(action, body, buttons)` posts the decision (see run.js).

import { h, pretty, when } from "./dom.js";

/** The edited arguments typed in `text`, or an error message saying how to fix them. */
export function parseArguments(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { error: `The arguments are not valid JSON (${err.message}). Fix them, or choose Discard edits to approve the call as the model made it.` };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    const kind = value === null ? "null" : Array.isArray(value) ? "a list" : `a ${typeof value}`;
    return { error: `The arguments must be a JSON object, like {"name": "value"}, not ${kind}.` };
  }
  return { value };
}

/** One line saying what an approval with edits ran with ("" without an edit). */
export function editedText(decision) {
  const edited = decision ? decision.edited_arguments : undefined;
  if (edited === undefined || edited === null) return "";
  return `ran with edited arguments ${typeof edited === "string" ? edited : JSON.stringify(edited)}`;
}

export function pendingCard(run, call, act) {
  const id = `call-${call.call_id}`;
  const original = pretty(call.arguments ?? {});
  const always = h("input", { type: "checkbox", id: `${id}-always` });
  const reason = h("input", {
    type: "text", id: `${id}-reason`, placeholder: "optional", autocomplete: "off", "aria-describedby": `${id}-reason-hint`,
  });
  const shown = h("pre", { class: "args", "aria-label": "arguments" }, original);
  const error = h("p", { class: "field-error", id: `${id}-args-error`, role: "alert" });
  const text = h("textarea", {
    class: "json", id: `${id}-args`, rows: String(Math.min(12, original.split("\n").length + 1)),
    spellcheck: "false", autocomplete: "off", "aria-describedby": `${id}-args-hint ${id}-args-error`,
  }, original);
  const editor = h("div", { class: "args-editor", id: `${id}-editor`, hidden: true },
    h("label", { for: `${id}-args` }, "Edited arguments (a JSON object)"), text,
    h("p", { class: "muted hint", id: `${id}-args-hint` },
      "The tool runs with these instead of the model's; the model's call stays as it made it."),
    error);
  const edit = h("button", {
    type: "button", class: "small", "aria-expanded": "false", "aria-controls": `${id}-editor`,
    "aria-label": `Edit arguments of ${call.tool} (${call.call_id})`,
  }, "Edit arguments");
  const approve = h("button", { type: "button", class: "primary", "aria-label": `Approve ${call.tool} (${call.call_id})` }, "Approve");
  const reject = h("button", { type: "button", class: "danger", "aria-label": `Reject ${call.tool} (${call.call_id})` }, "Reject");
  const buttons = [approve, reject, edit];
  let editing = false;

  function setEditing(on) {
    editing = on;
    editor.hidden = !on;
    shown.hidden = on;
    edit.textContent = on ? "Discard edits" : "Edit arguments";
    edit.setAttribute("aria-expanded", String(on));
    edit.setAttribute("aria-label", `${on ? "Discard edits to" : "Edit arguments of"} ${call.tool} (${call.call_id})`);
    // The visible text starts each button's name (speech input users say what they see).
    approve.textContent = on ? "Approve with edits" : "Approve";
    approve.setAttribute("aria-label", `${on ? "Approve with edits:" : "Approve"} ${call.tool} (${call.call_id})`);
    showError("");
    if (on) text.focus();
    else text.value = original;
  }

  function showError(message) {
    error.textContent = message;
    if (message) text.setAttribute("aria-invalid", "true");
    else text.removeAttribute("aria-invalid");
  }

  const common = () => ({ call_id: call.call_id, always: always.checked, reason: reason.value || undefined });
  edit.addEventListener("click", () => setEditing(!editing));
  text.addEventListener("input", () => showError(""));
  approve.addEventListener("click", () => {
    if (!editing) return act("approve", common(), buttons);
    const parsed = parseArguments(text.value);
    if (parsed.error) {
      showError(parsed.error);
      text.focus();
      return undefined;
    }
    return act("approve", { ...common(), arguments: parsed.value }, buttons);
  });
  reject.addEventListener("click", () => act("reject", common(), buttons));
  return h("article", { class: "pending-call", "aria-labelledby": `${id}-title`, "data-call": call.call_id },
    h("h3", { id: `${id}-title` }, h("code", {}, call.tool), h("span", { class: "muted" }, ` · ${call.call_id}`)),
    call.prompt ? h("p", { class: "prompt" }, call.prompt) : null,
    shown, editor,
    h("p", { class: "muted args-foot" }, `requested ${when(call.requested_at)} `, edit),
    h("div", { class: "decide reason-row" },
      h("label", { for: `${id}-reason` }, "Reason (to the model, if rejected)"), reason),
    h("p", { class: "muted hint", id: `${id}-reason-hint` },
      "On Reject, the reason is a message to the model: it gets “Tool call rejected: <reason>” as the call's result. On Approve, it is kept as a note."),
    h("div", { class: "decide" },
      h("label", { class: "check", for: `${id}-always` }, always, ` always for ${call.tool}`),
      approve, reject),
  );
}
