"""`upload_episode`: the row a robot's application creates, then the archive where it belongs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from episode_pipeline.db.episodes import EpisodeOrgMismatch
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.local.upload import archive_key, upload_episode

pytestmark = pytest.mark.integration


def _archive(tmp_path: Path, content: bytes = b"\x28\xb5\x2f\xfd not really zstd") -> Path:
    path = tmp_path / "robot-run.tar.zst"
    path.write_bytes(content)
    return path


def test_creates_the_row_and_the_object(
    stack: StackInfo,
    s3_client: Any,
    db_conn: psycopg.Connection,
    tmp_path: Path,
    episode_ref: Callable[..., EpisodeRef],
) -> None:
    ref = episode_ref()
    key = upload_episode(_archive(tmp_path), ref)
    assert key == f"orgs/{ref.org_id}/episodes/{ref.episode_id}/robot-run.tar.zst"
    assert key == archive_key(Path("x/robot-run.tar.zst"), ref)
    body = s3_client.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
    assert body == _archive(tmp_path).read_bytes()
    row = db_conn.execute(
        "SELECT org_id, status FROM episodes WHERE id = %s", (ref.episode_id,)
    ).fetchone()
    assert row == (ref.org_id, "uploaded")


def test_existing_row_is_left_alone(
    db_conn: psycopg.Connection,
    tmp_path: Path,
    episode_row: Callable[..., EpisodeRef],
) -> None:
    ref = episode_row(status="processed")
    upload_episode(_archive(tmp_path), ref)
    status = db_conn.execute("SELECT status FROM episodes WHERE id = %s", (ref.episode_id,))
    assert status.fetchone() == ("processed",)


def test_episode_of_another_org_is_refused(
    tmp_path: Path, episode_row: Callable[..., EpisodeRef], stack: StackInfo, s3_client: Any
) -> None:
    ref = episode_row(org_id="org-a")
    intruder = EpisodeRef("org-b", ref.episode_id)
    with pytest.raises(EpisodeOrgMismatch, match=ref.episode_id):
        upload_episode(_archive(tmp_path), intruder)
    listed = s3_client.list_objects_v2(Bucket=stack.bucket, Prefix=intruder.prefix)
    assert listed.get("KeyCount", 0) == 0


def test_missing_archive_names_the_file(stack: StackInfo, tmp_path: Path) -> None:
    missing = tmp_path / "nope.tar.zst"
    with pytest.raises(FileNotFoundError, match=r"nope\.tar\.zst"):
        upload_episode(missing, EpisodeRef("test-org", "ep-missing"))


def test_archive_must_end_in_zst(stack: StackInfo, tmp_path: Path) -> None:
    path = tmp_path / "robot-run.tar"
    path.write_bytes(b"tar")
    with pytest.raises(ValueError, match=r"robot-run\.tar.*\.zst"):
        upload_episode(path, EpisodeRef("test-org", "ep-suffix"))
