"""Reprocessing campaigns: the pure rules (ledger transitions, the governor, the canary, waves).

No I/O and no Dagster here: `db/campaigns.py` holds the SQL, `defs/sensors/campaign.py` the
driver, `commands/campaign.py` the command line (docs/operations.md#reprocess-the-fleet).
"""
