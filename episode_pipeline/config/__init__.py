"""Settings: every variable the pipeline reads, and the one `Settings` built from them."""
