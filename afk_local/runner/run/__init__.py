"""The run itself: @durable, ctx, one attempt, pauses, tags, StateCheckpoint, how a script ends."""
