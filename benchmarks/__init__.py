"""Speed and memory benchmarks: each stage against a baseline measured in the same run.

Run with ``python -m benchmarks.run`` (``make bench``); see ``benchmarks/README.md``.
"""
