"""Why a run failed: one taxonomy, declared by exception type, for the metrics and the campaign.

- The cause (`cause_class`): the `Cause` dimension of `EpisodesFailed` (runtime/metrics.py) and
  its alarms, and what the campaign driver reads of a failed run (a bad archive is not retried).
  Each cause is declared by the exception types that mean it; a subclass means what its nearest
  declared ancestor means. An error usually arrives as stored text from another process (a run
  task, the transcode program): Dagster's `SerializableErrorInfo` keeps only the class's name, so
  the lookup is by name, and the table of names is derived from the types imported here. A
  renamed class breaks an import (or `test_failure_causes_pure.py`), never silently the taxonomy.
- Backpressure (`classify_error`, `retry_after_seconds`) refines any failure: one whose text
  says a service refused it (S3 SlowDown / 503, ECS throttling or no capacity) is THROTTLED or
  NO_CAPACITY, with the `Retry-After` it gave. The campaign's governor backs off on these and
  counts the others (`OTHER`) in its failure rate (campaign/governor.py); the ledger retries them
  without using up an attempt (campaign/ledger.py).
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator, Mapping, Sequence

import psycopg
import zstandard
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from episode_pipeline.archive.stream import ArchiveError
from episode_pipeline.db.episodes import EpisodeNotFound, EpisodeOrgMismatch
from episode_pipeline.db.partition_tables import SkippedRows, TableMismatch
from episode_pipeline.db.schema_check import SchemaMismatch
from episode_pipeline.episodes.extraction import ArchiveNotFound, NotALeRobotDataset
from episode_pipeline.lerobot.frames import FrameDataError
from episode_pipeline.lerobot.info import DatasetInfoError
from episode_pipeline.lerobot.parquet import UnreadableParquet
from episode_pipeline.lerobot.tasks import TaskTableError
from episode_pipeline.storage.bucket import MissingStoredOutput
from episode_pipeline.transcode.job import (
    TranscodeDeadlineExceeded,
    TranscodeError,
    TranscodeFailed,
)
from episode_pipeline.video import FFmpegNotFound
from episode_pipeline.video.playlist import PlaylistError
from episode_pipeline.video.probe import ProbeError
from episode_pipeline.video.process import DeadlineExceeded

# -- the cause of a failure ----------------------------------------------------------------------

BAD_ARCHIVE = "bad_archive"
TRANSCODE = "transcode"
DATABASE = "database"
STORAGE = "storage"
TIMEOUT = "timeout"
CHECK = "check"
RUN_CRASHED = "run_crashed"
OTHER = "other"  # an ordinary failure: also the governor's class of a failure without backpressure
CAUSES = (BAD_ARCHIVE, TRANSCODE, DATABASE, STORAGE, TIMEOUT, CHECK, RUN_CRASHED, OTHER)

CAUSE_OF_TYPE: Mapping[type[BaseException], str] = {
    **dict.fromkeys(
        (
            ArchiveError,
            ArchiveNotFound,
            NotALeRobotDataset,
            DatasetInfoError,
            TaskTableError,
            FrameDataError,
            UnreadableParquet,
            zstandard.ZstdError,
            tarfile.ReadError,
        ),
        BAD_ARCHIVE,
    ),
    **dict.fromkeys(
        (TranscodeError, TranscodeFailed, FFmpegNotFound, PlaylistError, ProbeError), TRANSCODE
    ),
    **dict.fromkeys(
        (
            SchemaMismatch,
            EpisodeNotFound,
            EpisodeOrgMismatch,
            TableMismatch,
            SkippedRows,
            psycopg.Error,  # OperationalError, IntegrityError, errors.UniqueViolation, ...
        ),
        DATABASE,
    ),
    **dict.fromkeys(
        (
            ClientError,
            EndpointConnectionError,
            ConnectionClosedError,
            NoCredentialsError,
            MissingStoredOutput,
        ),
        STORAGE,
    ),
    **dict.fromkeys(
        (
            DeadlineExceeded,
            TranscodeDeadlineExceeded,  # nearer than TranscodeFailed: the transcode ran late
            TimeoutError,
            ReadTimeoutError,
            ConnectTimeoutError,
            # The database settings' timeouts (config.settings.DatabaseSettings), nearer than
            # psycopg.Error: statement, lock, idle in transaction, connect.
            psycopg.errors.QueryCanceled,
            psycopg.errors.LockNotAvailable,
            psycopg.errors.IdleInTransactionSessionTimeout,
            psycopg.errors.ConnectionTimeout,
        ),
        TIMEOUT,
    ),
}

# Exceptions the core may not import: the two subclass Dagster's `Failure` (the step's last try
# fails with them), the third is Dagster's. Named here, and `test_failure_causes_pure.py` imports
# each, so a rename fails that test.
CAUSE_OF_NAME_ABOVE_THE_CORE: Mapping[str, str] = {
    "TranscodeInterrupted": TRANSCODE,  # defs/assets/hls_renditions.py
    "StorageUnavailable": STORAGE,  # defs/assets/hls_renditions.py: the last try failed on S3
    "DagsterAssetCheckFailedError": CHECK,  # Dagster's, raised for a failed blocking check
}


def _subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def _cause_of_name() -> dict[str, str]:
    """Each declared type's name and its loaded subclasses' names → the cause. A declared name
    wins over a subclass's of the same name; a subclass takes its nearest declared ancestor's."""
    found = {cls.__name__: cause for cls, cause in CAUSE_OF_TYPE.items()}
    for declared in CAUSE_OF_TYPE:
        for subclass in _subclasses(declared):
            nearest = next(c for c in subclass.__mro__ if c in CAUSE_OF_TYPE)
            found.setdefault(subclass.__name__, CAUSE_OF_TYPE[nearest])
    return {**found, **CAUSE_OF_NAME_ABOVE_THE_CORE}


_CAUSE_OF_NAME = _cause_of_name()
_TIMEOUT_WORDS = re.compile(r"\b(deadline|timed out|timeout|maximum runtime)\b", re.IGNORECASE)


def cause_class(errors: Sequence[tuple[str | None, str, str]]) -> str:
    """The short cause class of a failure, from its errors as diagnosis reads them: (step or
    None for the run itself, the user's exception class, its message), first failing step first.

    A failure with no step error is the run's own: its process died, run monitoring failed it
    (timeout when it says it ran too long), or it was canceled — `run_crashed`.
    """
    if not errors:
        return RUN_CRASHED
    step, error_type, message = errors[0]
    found = _CAUSE_OF_NAME.get(error_type.rsplit(".", 1)[-1])
    if found is not None:
        return found
    if _TIMEOUT_WORDS.search(message):
        return TIMEOUT
    if step is None:
        return RUN_CRASHED
    return OTHER


# -- backpressure: a refinement of any failure, from its text -------------------------------------

THROTTLED = "throttled"  # S3 SlowDown / 503, ECS ThrottlingException, API rate exceeded
NO_CAPACITY = "no_capacity"  # ECS could not place the task
BACKPRESSURE = (THROTTLED, NO_CAPACITY)

# The forms botocore and AWS print, not a bare number: an episode id such as `ep-503` must not
# read as a throttle. Error codes as botocore quotes them (`An error occurred (SlowDown) ...`),
# case-sensitive as AWS spells them; an HTTP status only as `(503)` (botocore's code when the
# body had none), `status code 503`, `HTTP 503` / `HTTP/1.1 503`, `'HTTPStatusCode': 503` or
# urllib3's `too many 503 error responses`.
_THROTTLE_CODES = re.compile(
    r"\b(?:SlowDown|Slow Down|ServiceUnavailable|Service Unavailable|Throttling|"
    r"ThrottlingException|ThrottledException|RequestThrottled|TooManyRequests|"
    r"TooManyRequestsException|RequestLimitExceeded|Rate exceeded)\b"
)
_THROTTLE_STATUSES = re.compile(
    r"\((?:503|429)\)|"
    r"\b(?:status(?: code)?|HTTP(?:/\d(?:\.\d)?)?)\s*[:=]?\s*(?:503|429)\b|"
    r"HTTPStatusCode[\"']?\s*:\s*(?:503|429)\b|"
    r"\btoo many (?:503|429) error responses",
    re.IGNORECASE,
)
_CAPACITY_PATTERNS = re.compile(
    r"RESOURCE:(CPU|MEMORY|ENI)|Capacity is unavailable|insufficient capacity|"
    r"No Container Instances|unable to place",
    re.IGNORECASE,
)
_RETRY_AFTER = re.compile(r"Retry-After[\"']?\s*[:=]\s*[\"']?(\d+(?:\.\d+)?)", re.IGNORECASE)


def classify_error(message: str | None) -> str:
    """A failed run's error → THROTTLED, NO_CAPACITY or OTHER (the ledger's `error_class`)."""
    text = message or ""
    if _CAPACITY_PATTERNS.search(text):
        return NO_CAPACITY
    if _THROTTLE_CODES.search(text) or _THROTTLE_STATUSES.search(text):
        return THROTTLED
    return OTHER


def retry_after_seconds(message: str | None) -> float | None:
    """A `Retry-After: N` the error carried (delta-seconds), if any."""
    match = _RETRY_AFTER.search(message or "")
    return float(match.group(1)) if match else None
