// afk-local ui: the one event stream a browser holds for all its tabs of this page.
// A SharedWorker: each tab connects to it, it keeps a single EventSource on /events and
// hands every tab the ids of the runs that changed. Browsers allow six connections per
// host; one stream for any number of tabs keeps every tab loading and live.
"use strict";

const ports = new Set();
let source = null;

function tellAll(message) {
  for (const port of ports) port.postMessage(message);
}

function open() {
  source = new EventSource("/events");
  let lost = false;
  source.addEventListener("changed", (event) => tellAll(JSON.parse(event.data)));
  // After a lost connection, changes may have been missed: every tab refreshes.
  source.addEventListener("error", () => { lost = true; });
  source.addEventListener("open", () => {
    if (lost) tellAll("*");
    lost = false;
  });
}

onconnect = (event) => {
  const port = event.ports[0];
  ports.add(port);
  port.onmessage = (message) => {
    if (message.data === "bye") ports.delete(port);
  };
  port.start();
  if (source === null) open();
};
