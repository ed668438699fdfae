"""The runner: durable functions, their context, write modes and ``StateCheckpoint``.

``@afk.durable`` (:mod:`~afk_local.runner.durable_function`), ``ctx``
(:mod:`~afk_local.runner.run_context`), the sync/async/exit write modes
(:mod:`~afk_local.runner.writer`), code changes and migrations
(:mod:`~afk_local.runner.versions`), SIGTERM (:mod:`~afk_local.runner.stopping`),
finding a job by its entrypoint (:mod:`~afk_local.runner.entrypoints`).
"""
