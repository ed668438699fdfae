// afk-local ui: keeps the runs table and a run's page current and lets the keyboard move
// through the runs. Plain JavaScript, no library, nothing fetched from anywhere but this
// server. The server pushes changes (server-sent events, /events); a browser without
// EventSource polls instead (the runs table's rows, a run's page). Without JavaScript a
// run's page that runs reloads itself (a <noscript> refresh in run.html).
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

function showRows(body, html) {
  if (html === body.dataset.last) return;
  const runId = focusedRun();
  body.innerHTML = html;
  body.dataset.last = html;
  refocus(runId);
}

// The runs page: each "rows" event carries the table's new rows for this page's filters.
function followRuns(table, body) {
  const source = new EventSource(table.dataset.eventsUrl);
  source.addEventListener("rows", (event) => showRows(body, event.data));
}

// A run's page: a "run" event says the run changed; fetch the page once and swap the
// sections that show its state, leaving alone a section someone is typing in. A browser
// without EventSource fetches the page every second instead (less often when a fetch
// is slow, never in a hidden tab).
function followRun(main) {
  let busy = false;
  let again = false;
  window.afkRunEvents = 0;
  window.afkRunFetches = 0;
  async function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      window.afkRunFetches += 1;
      const answer = await fetch(location.pathname, {credentials: "same-origin", cache: "no-store"});
      if (answer.ok) {
        const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
        for (const old of document.querySelectorAll("[data-live]")) {
          const next = fresh.getElementById(old.id);
          const typing = old.contains(document.activeElement) || old.querySelector("form[data-dirty]");
          if (next && !typing && next.innerHTML !== old.innerHTML) old.replaceWith(document.adoptNode(next));
        }
      }
    } catch (err) {
      // the server stopped: keep what is shown
    }
    busy = false;
    if (again) {
      again = false;
      await refresh();
    }
  }
  document.addEventListener("input", (event) => {
    const form = event.target.closest("form");
    if (form) form.dataset.dirty = "1";
  });
  if (window.EventSource) {
    const source = new EventSource(main.dataset.runEvents);
    source.addEventListener("run", () => {
      window.afkRunEvents += 1;
      refresh();
    });
  } else {
    setTimeout(() => pollRun(refresh), POLL_MS);
  }
}

async function pollRun(refresh) {
  if (document.hidden) {
    document.addEventListener("visibilitychange", () => pollRun(refresh), {once: true});
    return;
  }
  const started = performance.now();
  await refresh();
  const took = performance.now() - started;
  setTimeout(() => pollRun(refresh), Math.max(POLL_MS, POLL_COST_FACTOR * took));
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
      showRows(body, await answer.text());
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
    if (window.EventSource) {
      followRuns(table, body);
    } else {
      setTimeout(() => refreshRuns(table, body), POLL_MS);
    }
  }
  const main = document.querySelector("main[data-run-events]");
  if (main) followRun(main);
});
