"""One run directory while it is used, in two rooms and what they share.

- ``write/``: the writer, a small orchestrator over the publish protocol (publisher),
  when to pack (pack_trigger), run.meta changes (meta_keeper), the effect journal it
  hands out (writer_journal), whether it may write (lifetime), and creating a run;
- beside them: the settings (options), the ownership lock, the mirror and journal
  seams, packing, delta or keyframe (delta_policy, delta_prefetch);
- ``read/``: where checkpoints are (catalog), delta chains, head records, the reader,
  verify and metric logs.
"""
