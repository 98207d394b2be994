// Deciding a tool call a run waits on: the card of one pending call, with its tool, call
// id, the agent's prompt and arguments, a reason, "always for this tool", Approve and
// Reject. `act(action, body, buttons)` posts the decision (see run.js).

import { h, pretty, when } from "./dom.js";

export function pendingCard(run, call, act) {
  const id = `call-${call.call_id}`;
  const always = h("input", { type: "checkbox", id: `${id}-always` });
  const reason = h("input", { type: "text", id: `${id}-reason`, placeholder: "optional", autocomplete: "off" });
  const approve = h("button", { type: "button", class: "primary", "aria-label": `Approve ${call.tool} (${call.call_id})` }, "Approve");
  const reject = h("button", { type: "button", class: "danger", "aria-label": `Reject ${call.tool} (${call.call_id})` }, "Reject");
  approve.addEventListener("click", () => act("approve", { call_id: call.call_id, always: always.checked, reason: reason.value || undefined }, [approve, reject]));
  reject.addEventListener("click", () => act("reject", { call_id: call.call_id, always: always.checked, reason: reason.value || undefined }, [approve, reject]));
  return h("article", { class: "pending-call", "aria-labelledby": `${id}-title`, "data-call": call.call_id },
    h("h3", { id: `${id}-title` }, h("code", {}, call.tool), h("span", { class: "muted" }, ` · ${call.call_id}`)),
    call.prompt ? h("p", { class: "prompt" }, call.prompt) : null,
    h("pre", { class: "args", "aria-label": "arguments" }, pretty(call.arguments ?? {})),
    h("p", { class: "muted" }, `requested ${when(call.requested_at)}`),
    h("div", { class: "decide" },
      h("label", { for: `${id}-reason` }, "Reason "), reason,
      h("label", { class: "check", for: `${id}-always` }, always, ` always for ${call.tool}`),
      approve, reject),
  );
}
