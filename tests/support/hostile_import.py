"""A module whose import alone leaves a marker: importing what a store names is execution.

The marker path comes from ``$AFK_HOSTILE_MARKER``; the attribute ``job`` is what a
crafted ``run.meta`` names (``hostile_import:job``).
"""

from __future__ import annotations

import os
from pathlib import Path

_marker = os.environ.get("AFK_HOSTILE_MARKER")
if _marker:
    Path(_marker).write_text("imported\n", encoding="utf-8")

job = None
