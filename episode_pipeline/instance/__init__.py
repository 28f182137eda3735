"""The Dagster instance's plugins, the classes `dagster.yaml` names: the pooled storages and the
event log's keyed reads (`storage.py`, `event_log_storage.py`), the run queue that tags, sizes
and holds runs (`run_coordinator.py`, with the campaigns' lanes: `campaign_queue.py`) and the
local instance's run launcher (`run_launcher.py`); and the run tags every layer reads
(`run_tags.py`) and the application's state in Dagster's key-value store (`app_state.py`).
Loaded by the daemon and webserver, never by `defs()`: they import neither the definitions nor
the services over the instance (pyproject.toml's import contracts).
"""
