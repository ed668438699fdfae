"""The runner: durable functions, in rooms by concern (lowest last).

- ``operations/``: what a person does to a run (resume, restart, cancel, settle, adopt, replay);
- ``run/``: the run itself (``@durable``, ``ctx``, one attempt, pauses, tags, ``StateCheckpoint``);
- ``time/``: durable time (sleeps, retries, limits);
- ``observe/``: the observer seam, the progress display, a run's report;
- ``code/``: a job's code (its entrypoint, where it ran, versions and migrations);
- ``writer``: the sync/async/exit write modes every room writes through.
"""
