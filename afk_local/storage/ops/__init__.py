"""Whole-run rewrites and copies under the run lock: gc and retention, fork,
removal, state edits, export and import.
"""
