"""Glue to other libraries (imported on demand: tilesparse itself does not need them)."""
