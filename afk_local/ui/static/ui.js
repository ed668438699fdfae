// afk-local ui: keeps the runs table and a run's page current and lets the keyboard move
// through the runs. Plain JavaScript, no library, nothing fetched from anywhere but this
// server. The server pushes the ids of the runs that changed (server-sent events,
// /events), through one stream for all of a browser's tabs (a SharedWorker,
// events.js; without one, each tab's own stream, closed while the tab is hidden); a page
// then fetches only what it shows of those runs. A browser without EventSource polls
// instead (the runs table's rows, a run's page). Without JavaScript a run's page that
// runs reloads itself (a <noscript> refresh in run.html).
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

// Call onChanged with the ids of the runs that changed ("*": any of them may have).
// Returns false when the browser cannot listen (no EventSource): the page polls then.
function listenForChanges(onChanged) {
  if (!window.EventSource) return false;
  if (window.SharedWorker) {
    try {
      const worker = new SharedWorker("/static/events.js", {name: "afk-local-events"});
      worker.port.onmessage = (message) => onChanged(message.data);
      worker.port.start();
      window.addEventListener("pagehide", () => worker.port.postMessage("bye"));
      return true;
    } catch (err) {
      // no shared worker here: a stream of this tab's own
    }
  }
  let source = null;
  function open() {
    source = new EventSource("/events");
    source.addEventListener("changed", (event) => onChanged(JSON.parse(event.data)));
    source.addEventListener("open", () => onChanged("*"));  // what changed before it listened
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden && source) {
      source.close();
      source = null;
    } else if (!document.hidden && !source) {
      open();
    }
  });
  if (!document.hidden) open();
  return true;
}

// Run one fetch at a time; a call while one runs asks for one more after it.
function oneAtATime(work) {
  let busy = false;
  let again = false;
  return async function run() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      await work();
    } catch (err) {
      // the server stopped: keep what is shown
    }
    busy = false;
    if (again) {
      again = false;
      await run();
    }
  };
}

// Replace the rows of the runs in html (rows of /runs/rows?ids=...) where they are shown.
function patchRows(body, html) {
  const fresh = document.createElement("tbody");
  fresh.innerHTML = html;
  const runId = focusedRun();
  for (const row of Array.from(fresh.querySelectorAll("tr[data-run]"))) {
    for (const old of body.querySelectorAll("tr[data-run]")) {
      if (old.dataset.run === row.dataset.run) old.replaceWith(row);
    }
  }
  body.dataset.last = body.innerHTML;
  refocus(runId);
}

// The runs page: a change to runs it shows fetches their rows alone; a change to another
// run fetches the whole page only on the first page (a new run may top it).
function followRuns(table, body) {
  let pending = new Set();
  let everything = false;
  window.afkRowFetches = 0;
  const refresh = oneAtATime(async () => {
    const ids = Array.from(pending);
    const all = everything;
    pending = new Set();
    everything = false;
    window.afkRowFetches += 1;
    const url = all ? table.dataset.rowsUrl : "/runs/rows?ids=" + encodeURIComponent(ids.join(","));
    const answer = await fetch(url, {credentials: "same-origin", cache: "no-store"});
    if (answer.ok) {
      const html = await answer.text();
      if (all) showRows(body, html);
      else patchRows(body, html);
    }
  });
  return listenForChanges((changed) => {
    const shown = new Set(Array.from(body.querySelectorAll("tr[data-run]"), (row) => row.dataset.run));
    if (changed === "*") {
      everything = true;
    } else {
      for (const runId of changed) {
        if (shown.has(runId)) pending.add(runId);
        else if (table.dataset.firstPage === "1") everything = true;
      }
    }
    if (everything || pending.size) refresh();
  });
}

// A run's page: a "run" event says the run changed; fetch the page once and swap the
// sections that show its state, leaving alone a section someone is typing in. A browser
// without EventSource fetches the page every second instead (less often when a fetch
// is slow, never in a hidden tab).
function followRun(main) {
  window.afkRunEvents = 0;
  window.afkRunFetches = 0;
  const refresh = oneAtATime(async () => {
    window.afkRunFetches += 1;
    const answer = await fetch(location.pathname, {credentials: "same-origin", cache: "no-store"});
    if (!answer.ok) return;
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    for (const old of document.querySelectorAll("[data-live]")) {
      const next = fresh.getElementById(old.id);
      const typing = old.contains(document.activeElement) || old.querySelector("form[data-dirty]");
      if (next && !typing && next.innerHTML !== old.innerHTML) old.replaceWith(document.adoptNode(next));
    }
  });
  document.addEventListener("input", (event) => {
    const form = event.target.closest("form");
    if (form) form.dataset.dirty = "1";
  });
  const runId = main.dataset.run;
  const listening = listenForChanges((changed) => {
    if (changed === "*" || changed.includes(runId)) {
      window.afkRunEvents += 1;
      refresh();
    }
  });
  if (!listening) setTimeout(() => pollRun(refresh), POLL_MS);
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
    if (!followRuns(table, body)) setTimeout(() => refreshRuns(table, body), POLL_MS);
  }
  const main = document.querySelector("main[data-run]");
  if (main) followRun(main);
});
