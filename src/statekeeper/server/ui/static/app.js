// The control UI's entry point: a hash router over the pages, and the login form.
//   #/                 the runs board        #/runs/ID        a run
//   #/sessions         sessions              #/sessions/ID    a session's transcript DAG
//   #/runs/ID/checkpoints/STEP               a run's state at a checkpoint, edit and rerun

import { auth } from "./api.js";
import { renderBoard } from "./board.js";
import { renderCheckpoint } from "./checkpoint.js";
import { clear, h, setLive } from "./dom.js";
import { renderRun } from "./run.js";
import { renderSession, renderSessions } from "./session.js";

const ROUTES = [
  [/^#?\/?$/, "runs", renderBoard],
  [/^#\/runs\/([^/]+)$/, "runs", renderRun],
  [/^#\/runs\/([^/]+)\/checkpoints\/(\d+)$/, "runs", renderCheckpoint],
  [/^#\/sessions\/?$/, "sessions", renderSessions],
  [/^#\/sessions\/([^/]+)$/, "sessions", renderSession],
];

let stopPage = null;
let askingForKey = false;

function route() {
  if (stopPage) stopPage();
  stopPage = null;
  setLive("off");
  const main = clear(document.getElementById("main"));
  if (askingForKey) return showLogin();
  const hash = window.location.hash || "#/";
  for (const [pattern, nav, render] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const args = match.slice(1).map(decodeURIComponent);
    stopPage = render(main, ...args) || null;
    return;
  }
  main.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the runs board")));
}

function showLogin(reason) {
  askingForKey = true;
  if (stopPage) stopPage();
  stopPage = null;
  const main = clear(document.getElementById("main"));
  const input = h("input", {
    id: "api-key", name: "key", type: "password", autocomplete: "off", required: true,
    spellcheck: "false", "aria-describedby": "key-help",
  });
  const form = h("form", { class: "login card", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Sign in"),
    reason ? h("p", { class: "error", role: "alert" }, reason) : null,
    h("label", { for: "api-key" }, "API key"),
    input,
    h("p", { id: "key-help", class: "muted" },
      "Create one with ", h("code", {}, "statekeeper keys create --tenant T --scope operate"),
      ". It is kept in this tab only (sessionStorage) and sent as a Bearer token."),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    auth.save(input.value);
    askingForKey = false;
    document.getElementById("logout").hidden = false;
    route();
  });
  main.append(form);
  input.focus();
}

window.addEventListener("sk:unauthorized", (event) => {
  if (event.detail && event.detail.key !== auth.key) return; // for a key given up since
  if (!askingForKey) showLogin(auth.key ? "The server refused this key." : "This server needs an API key.");
});
window.addEventListener("hashchange", () => {
  route();
  document.getElementById("main").focus({ preventScroll: true });
});
document.getElementById("logout").addEventListener("click", () => {
  auth.forget();
  document.getElementById("logout").hidden = true;
  showLogin();
});
document.getElementById("logout").hidden = !auth.key;
route();
