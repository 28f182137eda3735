"""The bodies of `episode-pipeline` sub-commands that outgrew a few lines in `cli.py`."""
