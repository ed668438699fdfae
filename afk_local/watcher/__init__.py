"""The watcher: finds runs whose process died and resumes each in a child process.

Discovery and the serving loop (:mod:`~afk_local.watcher.watcher`), attempts and
backoff (:mod:`~afk_local.watcher.attempts`), request files
(:mod:`~afk_local.watcher.requests`), login services
(:mod:`~afk_local.watcher.service`).
"""
