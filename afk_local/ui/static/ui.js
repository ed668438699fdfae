// afk-local ui: keeps the runs table current and lets the keyboard move through it.
// Plain JavaScript, no library, nothing fetched from anywhere but this server.
"use strict";

const POLL_MS = 1000;
// A large store makes each refresh cost more: wait a few times what the last one took,
// so one open tab never keeps the server busy; a hidden tab does not poll at all.
const POLL_COST_FACTOR = 4;

function focusedRun() {
  const row = document.activeElement && document.activeElement.closest("tr[data-run]");
  return row ? row.dataset.run : null;
}

function refocus(runId) {
  if (runId === null) return;
  for (const row of document.querySelectorAll("#runs-body tr[data-run]")) {
    if (row.dataset.run === runId) {
      row.querySelector("a.run-link").focus();
      return;
    }
  }
}

async function refreshRuns(table, body) {
  if (document.hidden) {
    document.addEventListener("visibilitychange", () => refreshRuns(table, body), {once: true});
    return;
  }
  const started = performance.now();
  try {
    const answer = await fetch(table.dataset.rowsUrl, {credentials: "same-origin", cache: "no-store"});
    if (answer.ok) {
      const html = await answer.text();
      if (html !== body.dataset.last) {
        const runId = focusedRun();
        body.innerHTML = html;
        body.dataset.last = html;
        refocus(runId);
      }
    }
  } catch (err) {
    // the server stopped: keep what is shown, try again
  }
  const took = performance.now() - started;
  setTimeout(() => refreshRuns(table, body), Math.max(POLL_MS, POLL_COST_FACTOR * took));
}

function moveInRuns(event) {
  const keys = {ArrowDown: 1, ArrowUp: -1, j: 1, k: -1};
  if (!(event.key in keys)) return;
  const link = event.target.closest("a.run-link");
  if (!link) return;
  const links = Array.from(document.querySelectorAll("#runs-body a.run-link"));
  const next = links[links.indexOf(link) + keys[event.key]];
  if (next) {
    next.focus();
    event.preventDefault();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("runs");
  const body = document.getElementById("runs-body");
  if (table && body) {
    body.dataset.last = "";
    table.addEventListener("keydown", moveInRuns);
    setTimeout(() => refreshRuns(table, body), POLL_MS);
  }
});
