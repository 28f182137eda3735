"""The external transcode process: `python -m episode_pipeline.transcode`, driven by Dagster Pipes.

Locally and in tests a subprocess of the run; in production an ECS task (`<prefix>-transcode`).
`job` holds the pure job/result types both sides share; `program` does the work.
"""
