"""Process-level helpers: crash-test injection points, leaving without Python's teardown."""
