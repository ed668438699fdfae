"""The local web page of a store: ``afk-local ui`` (the extra ``afk_local[ui]``).

A Starlette app served by uvicorn on 127.0.0.1 only, behind a random token
(:mod:`~afk_local.ui.access`). It reads the store's files directly, as the CLI
does, and acts (settle, answer, cancel, resume) through the same code as the CLI.
Modules: :mod:`~afk_local.ui.access` (token, Host and CSRF checks),
:mod:`~afk_local.ui.views` (what a page shows, as plain data),
:mod:`~afk_local.ui.charts` (metric charts as SVG), :mod:`~afk_local.ui.actions`
(the POSTs), :mod:`~afk_local.ui.app` (routes and templates) and
:mod:`~afk_local.ui.server` (the socket and uvicorn).
"""
