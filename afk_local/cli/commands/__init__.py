"""The command groups of afk-local, one module each; cli/main.py wires them in."""
