"""One episode: its keys, the extraction of its archive and what the rows say about it."""
