"""The stack's moto server: SQS receive checks retention from the one attribute, as moto does."""

from __future__ import annotations

import time
from types import SimpleNamespace

from episode_pipeline.local import moto_main


def backend(retention_seconds: str) -> SimpleNamespace:
    queue = SimpleNamespace(message_retention_period=retention_seconds)
    return SimpleNamespace(get_queue=lambda name: queue)


def message(age_seconds: float) -> SimpleNamespace:
    return SimpleNamespace(sent_timestamp=(time.time() - age_seconds) * 1000)


def test_a_message_is_retained_until_its_queue_retention_period_passes() -> None:
    assert moto_main.retained(backend("60"), "q", message(1))
    assert not moto_main.retained(backend("60"), "q", message(61))


def test_the_patch_replaces_moto_s_check() -> None:
    from moto.sqs.models import SQSBackend

    original = SQSBackend.is_message_valid_based_on_retention_period
    try:
        moto_main.patch_moto()
        assert SQSBackend.is_message_valid_based_on_retention_period is moto_main.retained
    finally:
        SQSBackend.is_message_valid_based_on_retention_period = original  # type: ignore[method-assign]
