"""The explorer's workloads beyond the basic writers (:mod:`..workloads`), by what they
write: rewrites of a run (``rewrites``: pack, merge, gc, fork, export), the operations a
person does on a run (``operations``: cancel, pause, answer, settle, tags, rm, sleeps),
edits of a run's files (``edits``), the store's own files (``store_files``: schedules,
limits, requests, adopt) and what is written outside the runs (``outside``: a new root, an
export file, the watcher's service file, push and pull). :mod:`..registry` gathers them."""
