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

// A tab may miss a change made between its page being rendered and it listening, and
// every tab may miss those of a lost connection: once the stream is open (again), and
// to a tab that connects to an open stream, "*" says "refresh once".
function open() {
  source = new EventSource("/events");
  source.addEventListener("changed", (event) => tellAll(JSON.parse(event.data)));
  source.addEventListener("open", () => tellAll("*"));
}

onconnect = (event) => {
  const port = event.ports[0];
  ports.add(port);
  port.onmessage = (message) => {
    if (message.data === "bye") ports.delete(port);
  };
  port.start();
  if (source === null) open();
  else if (source.readyState === EventSource.OPEN) port.postMessage("*");
};
