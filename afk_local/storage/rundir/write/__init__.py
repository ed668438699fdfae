"""Writing a run directory: RunWriter and the collaborators it orchestrates, and creating a run."""
