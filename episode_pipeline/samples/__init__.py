"""Writing LeRobot sample archives (the demo, tests and benchmarks); the reader is `lerobot/`."""
