"""The local stack's port rule (pure): a dead server comes back where its clients look for it."""

from __future__ import annotations

import pytest

from episode_pipeline.local.stack import PortTakenError, restart_port


def test_a_first_start_picks_a_free_port() -> None:
    assert restart_port("PostgreSQL", None, None, stopped_cleanly=True) is None


@pytest.mark.parametrize("stopped_cleanly", [True, False])
def test_a_recorded_port_nobody_holds_is_kept(stopped_cleanly: bool) -> None:
    assert restart_port("moto", 41234, None, stopped_cleanly=stopped_cleanly) == 41234


def test_a_dead_server_s_port_held_by_another_process_is_an_error_naming_both() -> None:
    with pytest.raises(PortTakenError) as raised:
        restart_port("PostgreSQL", 41234, "pid 77 (nc -l 41234)", stopped_cleanly=False)
    message = str(raised.value)
    assert "PostgreSQL's port 41234" in message
    assert "pid 77 (nc -l 41234)" in message
    assert "stack down" in message  # and how to get out of it


def test_after_a_clean_stop_a_taken_port_is_replaced() -> None:
    # Nothing runs against a stopped stack (`stack down` stops it all): nobody is stranded.
    assert restart_port("moto", 41234, "pid 77", stopped_cleanly=True) is None
