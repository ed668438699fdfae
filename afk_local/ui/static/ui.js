// afk-local ui: keeps the runs table current and lets the keyboard move through it.
// Plain JavaScript, no library, nothing fetched from anywhere but this server.
"use strict";

const POLL_MS = 1000;

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
  setTimeout(() => refreshRuns(table, body), POLL_MS);
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
