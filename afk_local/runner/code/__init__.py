"""A job's code: its entrypoint, where it ran and how to go back, versions and migrations."""
