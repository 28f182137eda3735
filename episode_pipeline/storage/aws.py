"""boto3 clients made one way: the endpoint, keys and region of `AwsSettings`, explicit retries.

Locally the endpoint is the moto server and the keys are moto's; on AWS the endpoint is None and
the task role signs. Clients of the same settings come from one session, made under a lock:
boto3 sessions are not thread-safe (their clients are), and a session parses a service's model
once — about 0.2 s for S3 — so a second client from it costs ~10 ms instead of another parse.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

from episode_pipeline.config.settings import AwsSettings

_sessions: dict[AwsSettings, boto3.session.Session] = {}
_sessions_lock = threading.Lock()


def aws_client(service: str, aws: AwsSettings, **config: Any) -> Any:
    """A boto3 client for `service`; `config` is passed to botocore's `Config` (retries, pools)."""
    with _sessions_lock:
        session = _sessions.get(aws)
        if session is None:
            session = _sessions[aws] = boto3.session.Session(
                aws_access_key_id=aws.access_key_id,
                aws_secret_access_key=aws.secret_access_key,
                region_name=aws.region,
            )
        return session.client(
            service,
            endpoint_url=aws.endpoint_url,
            config=Config(region_name=aws.region, **config),
        )


class LazyClient:
    """One boto3 client made on first use, under a lock, then shared by every thread."""

    def __init__(self, service: str, aws: AwsSettings, **config: Any) -> None:
        self._service = service
        self._aws = aws
        self._config = config
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = aws_client(self._service, self._aws, **self._config)
        return self._client
