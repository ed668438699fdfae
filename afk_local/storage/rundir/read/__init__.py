"""Reading a run directory: catalog, chains, head records, RunReader, verify, metric logs."""
