"""The services over Dagster's instance: what the sensors, jobs and commands call to read and
write runs, partitions, backfills and the event log. runs.py (which run an upload has, what is
in flight, partition adds), run_errors.py (a failed run's errors), event_log.py (the reads of
the event log), failures.py (one failure policy), backfills.py (a backfill as the UI records
one), retention.py (Dagster keeps the working set), campaigns.py (the campaign driver's tick),
batches.py (a batch run's episodes, each its own child run), dagster_tables.py (every statement
on Dagster's own tables), upload_runs.py (an upload-queue message becomes a run), lost_uploads.py
(the reconciliation's tick), stale_processing.py (episodes left `processing` by a dead run),
archive_versions.py (`raw_archive` observed at an upload's ETag). They import the definitions'
names (asset keys, partition names, the database resource) but no asset, check, sensor or job.
"""
