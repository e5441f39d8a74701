// The runwarden console's one script (O4). It only opens the live streams a page names in
// `data-stream` and puts the server's HTML fragments in place: every fragment is rendered
// and escaped by the server, so nothing here builds markup from data.
"use strict";

function follow(target) {
  const url = target.getAttribute("data-stream");
  const mode = target.getAttribute("data-mode");
  const headId = target.getAttribute("data-head");
  const source = new EventSource(url);
  document.body.setAttribute("data-live", "connecting");
  source.addEventListener("open", () => document.body.setAttribute("data-live", "open"));
  // A replacement waits while the user types in the part it replaces (a deny reason,
  // edited arguments), and lands when they leave it.
  let held = null;
  const replace = (html) => {
    const active = document.activeElement;
    if (active && active !== document.body && target.contains(active) && active.matches("input, textarea, select")) {
      held = html;
      return;
    }
    held = null;
    target.innerHTML = html;
    document.body.setAttribute("data-rows-updated", String(Date.now()));
  };
  target.addEventListener("focusout", () => {
    if (held !== null) setTimeout(() => held !== null && replace(held), 0);
  });
  source.addEventListener("rows", (e) => {
    if (mode === "replace") replace(e.data);
  });
  source.addEventListener("entry", (e) => {
    if (mode === "append") {
      target.insertAdjacentHTML("beforeend", e.data);
    }
  });
  source.addEventListener("head", (e) => {
    const head = headId && document.getElementById(headId);
    if (head) {
      head.innerHTML = e.data;
    }
  });
  source.addEventListener("error", () => {
    // The server ends a run's stream after its final event; the browser would reconnect
    // and replay, so a closed stream stays closed.
    if (source.readyState !== EventSource.OPEN) {
      source.close();
      document.body.setAttribute("data-live", "closed");
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-stream]").forEach(follow);
});
