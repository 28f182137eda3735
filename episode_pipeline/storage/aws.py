"""boto3 clients made one way: the endpoint, keys and region of `AwsSettings`, explicit retries;
and what an AWS error says about itself (`aws_fault`: code, status, Retry-After).

Locally the endpoint is the moto server and the keys are moto's; on AWS the endpoint is None and
the task role signs. Clients of the same settings come from one session, made under a lock:
boto3 sessions are not thread-safe (their clients are), and a session parses a service's model
once — about 0.2 s for S3 — so a second client from it costs ~10 ms instead of another parse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

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


@dataclass(frozen=True)
class AwsFault:
    """What an AWS call's failure says about itself: the service's error code (`SlowDown`,
    `ThrottlingException`; the exception's class for a connection or timeout error), the HTTP
    status, and the `Retry-After` the response carried (delta-seconds), if any."""

    code: str
    status: int | None = None
    retry_after_seconds: float | None = None

    def describe(self) -> str:
        """`SlowDown (HTTP 503), Retry-After: 5`: the form `runtime/failure_causes` parses."""
        text = self.code + (f" (HTTP {self.status})" if self.status else "")
        if self.retry_after_seconds is not None:
            text += f", Retry-After: {self.retry_after_seconds:g}"
        return text


def retry_after_of(headers: Mapping[str, Any]) -> float | None:
    """The `Retry-After` header as seconds: delta-seconds only (S3 and ECS send no HTTP-date;
    one is ignored rather than guessed at). botocore lower-cases header names."""
    value = str(headers.get("retry-after", headers.get("Retry-After", ""))).strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and what it was raised from or during, innermost last, each once.

    boto3's `S3Transfer.upload_file` raises `S3UploadFailedError` inside `except ClientError`
    without `from`: the ClientError (and its response) is only its `__context__`.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def aws_fault(error: BaseException) -> AwsFault | None:
    """The AWS failure in `error`'s chain (botocore or boto3), or None when there is none: the
    service's answer when one came back (code, status, Retry-After from its headers, which
    botocore's message does not carry), else the client-side error's class."""
    found: AwsFault | None = None
    for link in _chain(error):
        if isinstance(link, ClientError):
            response = link.response or {}
            metadata = response.get("ResponseMetadata") or {}
            return AwsFault(
                code=str((response.get("Error") or {}).get("Code") or type(link).__name__),
                status=metadata.get("HTTPStatusCode"),
                retry_after_seconds=retry_after_of(metadata.get("HTTPHeaders") or {}),
            )
        if found is None and isinstance(link, BotoCoreError | Boto3Error):
            found = AwsFault(code=type(link).__name__)
    return found
