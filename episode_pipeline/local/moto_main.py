"""`python -m episode_pipeline.local.moto_main`: moto's server, its SQS receive made linear.

moto 5's `ReceiveMessage` checks each returned message's retention period by computing all of
the queue's attributes, three approximate message counts among them, each a pass over every
message of the queue: one receive costs seconds at 1,000 queued messages
(docs/platform-notes.md#moto), where SQS answers in milliseconds. A burst of a fleet on the
local stack then measures moto. The same check is made here from the queue's own
`MessageRetentionPeriod`, with moto's result; everything else is moto's server as is.
"""

from __future__ import annotations

import sys
from typing import Any


def retained(backend: Any, queue_name: str, message: Any) -> bool:
    """moto's `is_message_valid_based_on_retention_period`, reading only the one attribute."""
    from moto.core.utils import unix_time

    period = int(backend.get_queue(queue_name).message_retention_period)
    return period + message.sent_timestamp / 1000 > unix_time()


def patch_moto() -> None:
    from moto.sqs.models import SQSBackend

    SQSBackend.is_message_valid_based_on_retention_period = retained  # type: ignore[method-assign]


def main() -> None:
    patch_moto()
    from moto.server import main as moto_server

    moto_server(sys.argv[1:])


if __name__ == "__main__":
    main()
