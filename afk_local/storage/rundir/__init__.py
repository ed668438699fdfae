"""One run directory while it is used: where its checkpoints are (catalog), how a
delta chain is followed, the reader, the ownership lock, head records, packing,
verify, metric logs and the mirror seam; and the writer, a small orchestrator over
the publish protocol (publisher), delta or keyframe (delta_policy), when to pack
(pack_trigger), run.meta changes (meta_keeper), the effect journal it hands out
(writer_journal) and whether it may write (lifetime).
"""
