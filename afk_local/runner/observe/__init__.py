"""Observation: the observer seam tracers plug into, the progress display, a run's report."""
