"""One run directory while it is used: where its checkpoints are (catalog), how a
delta chain is followed, the reader, the writer's publish protocol, the ownership
lock, head records, packing, verify, metric logs and the mirror seam.
"""
