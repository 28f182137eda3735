"""Upload an episode archive the way a robot does: the episode row first, then the object.

In production the application creates the episode row before the robot uploads; the pipeline
only updates it. Locally this function plays both parts, so the bucket notification that the
upload triggers finds the row already there.
"""

from __future__ import annotations

from pathlib import Path

import boto3

from episode_pipeline.db.connection import connect
from episode_pipeline.keys import ARCHIVE_SUFFIX, EpisodeRef
from episode_pipeline.settings import Settings, load_settings


class EpisodeOrgMismatch(ValueError):
    """The episode id already exists under another org."""


def archive_key(archive: Path, ref: EpisodeRef) -> str:
    """`orgs/ORG/episodes/EP/<archive file name>`."""
    return f"{ref.prefix}{archive.name}"


def ensure_episode_row(settings: Settings, ref: EpisodeRef) -> None:
    """Insert the episode with status 'uploaded' unless it exists (then its org must match)."""
    with connect(settings.database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO episodes (id, org_id, status) VALUES (%s, %s, 'uploaded') "
            "ON CONFLICT (id) DO NOTHING",
            (ref.episode_id, ref.org_id),
        )
        row = conn.execute(
            "SELECT org_id FROM episodes WHERE id = %s", (ref.episode_id,)
        ).fetchone()
    if row is None or row[0] != ref.org_id:
        raise EpisodeOrgMismatch(
            f"episodes.org_id for episode {ref.episode_id!r} is {row[0] if row else None!r}, "
            f"not {ref.org_id!r}"
        )


def s3_client(settings: Settings):
    return boto3.client(
        "s3",
        endpoint_url=settings.aws_endpoint_url,
        region_name=settings.aws_region,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
    )


def upload_episode(archive: Path, ref: EpisodeRef, settings: Settings | None = None) -> str:
    """Create the row if absent and upload `archive`; returns the object key.

    boto3's `upload_file` switches to multipart above 8 MB; moto then queues two ObjectCreated
    events for the one object (AWS queues one).
    """
    archive = Path(archive)
    if not archive.is_file():
        raise FileNotFoundError(f"archive {archive} does not exist or is not a file")
    if not archive.name.endswith(ARCHIVE_SUFFIX):
        raise ValueError(
            f"archive {archive}: file name must end in {ARCHIVE_SUFFIX!r}, or the upload "
            "triggers no processing"
        )
    settings = settings or load_settings()
    ensure_episode_row(settings, ref)
    key = archive_key(archive, ref)
    s3_client(settings).upload_file(
        str(archive), settings.bucket, key, ExtraArgs={"ContentType": "application/zstd"}
    )
    return key
