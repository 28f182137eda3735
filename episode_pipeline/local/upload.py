"""Upload an episode archive the way a robot does: the episode row first, then the object.

In production the application creates the episode row before the robot uploads; the pipeline
only updates it. Locally this function plays both parts, so the bucket notification that the
upload triggers finds the row already there.
"""

from __future__ import annotations

from pathlib import Path

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.connection import connect
from episode_pipeline.db.episodes import ensure_episode_row
from episode_pipeline.episodes.keys import ARCHIVE_SUFFIX, EpisodeRef
from episode_pipeline.local.stack_env import load_settings
from episode_pipeline.storage.bucket import Bucket


def archive_key(archive: Path, ref: EpisodeRef) -> str:
    """`orgs/ORG/episodes/EP/<archive file name>`."""
    return f"{ref.prefix}{archive.name}"


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
    with connect(settings.database, autocommit=True) as conn:
        ensure_episode_row(conn, ref)
    key = archive_key(archive, ref)
    Bucket(settings.bucket, settings.aws).upload_file(archive, key)
    return key
