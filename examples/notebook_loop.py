"""The notebook pattern: paste this into a cell; re-run the cell after a kernel restart.

    python examples/notebook_loop.py

StateCheckpoint needs no decorator and no store: a directory is enough.
``load()`` returns the last saved state (None when fresh or finished), so check
``is_complete`` first: a finished loop is not run again, its result is shown.
"""

from __future__ import annotations

import os

import afk_local as afk

root = os.environ.get("AFK_LOCAL_ROOT", ".afk")
ckpt = afk.StateCheckpoint(os.path.join(root, "notebook-demo"))

if ckpt.is_complete:  # finished in an earlier run of the cell: do not train again
    print("already done:", ckpt.get_result())
else:
    state = ckpt.load() or {"epoch": 0, "losses": []}
    print(f"starting at epoch {state['epoch']}")
    for epoch in range(state["epoch"], 20):
        loss = 1.0 / (epoch + 1)  # the expensive part of a real cell
        state["losses"].append(round(loss, 4))
        state["epoch"] = epoch + 1
        ckpt.save(state)  # durable when it returns: a crash now loses nothing
    ckpt.mark_complete({"final_loss": state["losses"][-1], "epochs": state["epoch"]})
    print("done:", ckpt.get_result())
