"""What listings, notebooks and the UI show of runs: run info, listing filters,
progress and the notebook's HTML and text. Reads records, writes nothing.
"""
