"""The episode asset graph end to end on the real local stack (PostgreSQL, moto server, FFmpeg).

Each test uploads its own sample episode under a fresh id, so tests share the stack but not data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, RunsFilter

from episode_pipeline.db import episodes as episode_db
from episode_pipeline.episodes.episode_rows import REQUIRED_KEYS
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.episodes.timeline import TIMELINE_NAME
from episode_pipeline.instance.run_tags import UPLOAD_TAG
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.runner import process_episode, run_checks
from episode_pipeline.samples.writer import SampleSpec, pack_archive, write_dataset, write_sample
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.graph import latest_metadata, report_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "episode_pipeline.cli"]
ALL_CHECKS = {
    "frames_match_parquet_rows",
    "frames_timestamps_increasing",
    "frames_files_readable",
    "processed_objects_exist",
    "metadata_keys_present",
    "frame_count_matches_rows",
    "hls_playlists_valid",
    "hls_sources_readable",
    "hls_duration_matches_sources",
    "hls_decodes_to_source_frames",
    "frames_state_present",
    "video_frames_in_sync",
}


def sample(tmp_path: Path, **spec) -> tuple[Path, dict]:
    out = tmp_path / f"sample-{uuid.uuid4().hex[:6]}.tar.zst"
    summary = write_sample(out, SampleSpec(**{"seconds": 1.0, **spec}))
    return out, summary


def uploaded(tmp_path: Path, **spec) -> tuple[EpisodeRef, dict]:
    ref = new_ref()
    archive, summary = sample(tmp_path, **spec)
    upload_episode(archive, ref)
    return ref, summary


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, check=check, env=os.environ.copy()
    )


def state_of(db_conn, s3_client, bucket: str, ref: EpisodeRef) -> dict:
    """Everything the pipeline wrote for an episode, minus ids and clocks."""
    frames = db_conn.execute(
        "SELECT frame_order, lerobot_episode_index, frame_index, timestamp_ms,"
        " observation::text, action::text FROM frames WHERE episode_id = %s ORDER BY frame_order",
        (ref.episode_id,),
    ).fetchall()
    metadata = db_conn.execute(
        "SELECT meta_key, value, status FROM episode_metadata"
        " WHERE episode_id = %s ORDER BY meta_key",
        (ref.episode_id,),
    ).fetchall()
    versions = db_conn.execute(
        "SELECT version, operation, data::text FROM entity_versions WHERE entity_id = %s",
        (ref.episode_id,),
    ).fetchall()
    row = episode_db.episode_row(db_conn, ref)
    episode = {
        k: row[k]
        for k in (
            "status",
            "mp4_s3_path",
            "parquet_s3_path",
            "frame_count",
            "fps",
            "duration_seconds",
        )
    }
    objects = {}
    paginator = s3_client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=ref.processed_prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(ref.processed_prefix) :]
            if relative == TIMELINE_NAME:  # it names its episode: compared as a document
                body = s3_client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                objects[relative] = {**json.loads(body), "episode": None}
            elif not relative.startswith("_dagster/"):  # the manifest holds the archive's ETag
                objects[relative] = (item["Size"], item["ETag"])
    return {
        "frames": frames,
        "metadata": metadata,
        "versions": versions,
        "episode": episode,
        "objects": objects,
    }


def relative(state: dict, ref: EpisodeRef) -> dict:
    """The same state with this episode's prefix removed, to compare two episodes."""
    text = json.dumps(state, default=str).replace(ref.prefix, "<prefix>/")
    return json.loads(text)


def test_v30_sample_through_the_cli(tmp_path, stack):
    ref = new_ref()
    archive, summary = sample(tmp_path, codebase_version="v3.0", cameras=2)
    cli("upload", str(archive), "--org", ref.org_id, "--episode", ref.episode_id)
    processed = cli("process", ref.partition_key)
    assert "processed" in processed.stdout
    (report,) = json.loads(cli("status", ref.partition_key, "--json").stdout)

    assert report["status"] == "processed"
    assert report["frames_rows"] == summary["total_frames"] == report["frame_count"]
    assert report["fps"] == 30
    assert report["duration_seconds"] == 1
    assert report["mp4_s3_path"].startswith(ref.processed_prefix + "lerobot_episode/videos/")
    assert report["parquet_s3_path"] == (
        ref.processed_prefix + "lerobot_episode/data/chunk-000/file-000.parquet"
    )
    assert report["metadata"]["episode_title"] == summary["task"]
    assert report["metadata"]["codebase_version"] == "v3.0"
    assert report["metadata"]["robot_type"] == summary["robot_type"]
    assert set(REQUIRED_KEYS) <= set(report["metadata"])
    assert report["checks"] == {name: True for name in ALL_CHECKS}
    cameras = ["observation.images.front", "observation.images.wrist"]
    assert sorted(rendition["camera"] for rendition in report["hls"]) == cameras
    for rendition in report["hls"]:
        assert rendition["playlist"] == ref.hls_prefix(rendition["camera"]) + "playlist.m3u8"
        assert rendition["source"].endswith(".mp4")


def test_v21_sample_processes_and_reprocessing_changes_nothing(tmp_path, stack, db_conn, s3_client):
    ref, summary = uploaded(tmp_path, codebase_version="v2.1", cameras=2, episodes=2)
    assert process_episode(ref)
    first = state_of(db_conn, s3_client, stack.bucket, ref)
    report = report_for(ref)
    assert report["status"] == "processed"
    assert report["frames_rows"] == summary["total_frames"] == 2 * summary["frames_per_episode"]
    assert report["metadata"]["codebase_version"] == "v2.1"
    assert all(report["checks"].values()), report["checks"]
    # v2.1 writes one data file per LeRobot episode: frame_order runs on across them.
    orders = [row[0] for row in first["frames"]]
    assert orders == list(range(summary["total_frames"]))
    expected_keys = {
        f"lerobot_episode/{path}"
        for path in summary["files"]
        if path.endswith((".mp4", ".parquet"))
        or path in ("meta/info.json", "meta/tasks.jsonl", "meta/episodes.jsonl")
    }
    keys = set(first["objects"])
    assert {key for key in keys if not key.startswith("hls/")} == expected_keys | {TIMELINE_NAME}
    # Per camera the baseline rendition (both LeRobot episodes, 2 x 1 s, fit in one 4-second
    # segment), the ladder's master playlist and the poster; nothing outside a camera's folder.
    for camera in summary["cameras"]:
        assert {
            f"hls/{camera}/playlist.m3u8",
            f"hls/{camera}/segment_00000.ts",
            f"hls/{camera}/master.m3u8",
            f"hls/{camera}/poster.jpg",
        } <= keys
    hls_cameras = {key.split("/")[1] for key in keys if key.startswith("hls/")}
    assert hls_cameras == set(summary["cameras"])

    assert process_episode(ref)
    assert state_of(db_conn, s3_client, stack.bucket, ref) == first
    assert len(first["versions"]) == 1 and first["versions"][0][:2] == (1, "create")


def test_several_lerobot_episodes_float64_and_variable_length_lists(tmp_path, stack, db_conn):
    spec = SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0, episodes=3)
    folder = tmp_path / "dataset"
    summary = write_dataset(folder, spec)
    (data_path,) = summary["data_files"]
    table = pq.read_table(folder / data_path)
    double_lists = pa.list_(pa.float64())
    for name in ("observation.state", "action"):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, table[name].cast(double_lists))
    table = table.drop_columns(["frame_index"])
    pq.write_table(table, folder / data_path)
    archive = tmp_path / "variants.tar.zst"
    pack_archive(folder, archive, root_folder=None)
    ref = new_ref()
    upload_episode(archive, ref)

    assert process_episode(ref)
    report = report_for(ref)
    assert report["status"] == "processed"
    assert report["frames_rows"] == summary["total_frames"] == 3 * spec.frames_per_episode
    assert all(report["checks"].values()), report["checks"]
    episodes, missing_frame_index = db_conn.execute(
        "SELECT count(DISTINCT lerobot_episode_index), count(*) FILTER (WHERE frame_index IS NULL)"
        " FROM frames WHERE episode_id = %s",
        (ref.episode_id,),
    ).fetchone()
    assert episodes == 3 and missing_frame_index == summary["total_frames"]
    observation, action = db_conn.execute(
        "SELECT observation, action FROM frames WHERE episode_id = %s AND frame_order = 5",
        (ref.episode_id,),
    ).fetchone()
    source = table.slice(5, 1).to_pylist()[0]
    assert observation == {"state": pytest.approx(source["observation.state"])}
    assert action == pytest.approx(source["action"])


def test_each_check_fails_when_its_condition_is_broken(tmp_path, stack, db_conn, s3_client):
    ref, _ = uploaded(tmp_path, codebase_version="v3.0", cameras=1)
    assert process_episode(ref)
    assert run_checks(ref) == {name: True for name in ALL_CHECKS}

    db_conn.execute(
        "DELETE FROM frames WHERE episode_id = %s AND frame_order = 3", (ref.episode_id,)
    )
    assert run_checks(ref, {"frames_match_parquet_rows"}) == {"frames_match_parquet_rows": False}

    db_conn.execute(
        "UPDATE frames SET timestamp_ms = 0 WHERE episode_id = %s AND frame_order = 10",
        (ref.episode_id,),
    )
    assert run_checks(ref, {"frames_timestamps_increasing"}) == {
        "frames_timestamps_increasing": False
    }

    db_conn.execute(
        "DELETE FROM episode_metadata WHERE episode_id = %s AND meta_key = 'robot_type'",
        (ref.episode_id,),
    )
    assert run_checks(ref, {"metadata_keys_present"}) == {"metadata_keys_present": False}

    db_conn.execute("UPDATE episodes SET frame_count = 999 WHERE id = %s", (ref.episode_id,))
    assert run_checks(ref, {"frame_count_matches_rows"}) == {"frame_count_matches_rows": False}

    video_key = report_for(ref)["mp4_s3_path"]
    s3_client.delete_object(Bucket=stack.bucket, Key=video_key)
    assert run_checks(ref, {"processed_objects_exist"}) == {"processed_objects_exist": False}


def test_rows_lost_to_an_unreadable_parquet_fail_the_rows_check_and_the_episode(tmp_path, stack):
    spec = SampleSpec(codebase_version="v2.1", cameras=1, seconds=1.0, episodes=2)
    folder = tmp_path / "dataset"
    summary = write_dataset(folder, spec)
    broken = folder / summary["data_files"][1]
    broken.write_bytes(b"PAR1 this is not a parquet file PAR1")
    archive = tmp_path / "broken.tar.zst"
    pack_archive(folder, archive, root_folder="lerobot_episode")
    ref = new_ref()
    upload_episode(archive, ref)

    # The readable file's rows are written, but the archive held more: the frames table must
    # never be silently short while the episode says processed.
    outcome = process_episode(ref)
    assert not outcome
    report = report_for(ref)
    assert report["status"] == "failed"
    assert report["frames_rows"] == spec.frames_per_episode
    assert report["checks"]["frames_files_readable"] is False
    assert report["checks"]["frames_match_parquet_rows"] is False


def test_archive_without_info_json_fails_the_episode_naming_the_file(tmp_path, stack):
    folder = tmp_path / "dataset"
    write_dataset(folder, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    (folder / "meta" / "info.json").unlink()
    archive = tmp_path / "no-info.tar.zst"
    pack_archive(folder, archive, root_folder=None)
    ref = new_ref()
    upload_episode(archive, ref)

    outcome = process_episode(ref)
    assert not outcome.success
    assert any("meta/info.json" in error for error in outcome.errors), outcome.errors
    assert report_for(ref)["status"] == "failed"


def test_a_killed_run_then_rerun_converges(tmp_path, stack, db_conn, s3_client):
    archive, _ = sample(tmp_path, codebase_version="v3.0", cameras=2, seconds=4.0)
    reference, killed = new_ref(), new_ref()
    for ref in (reference, killed):
        upload_episode(archive, ref)
    assert process_episode(reference)

    scratch = tmp_path / "killed-tmp"  # what the SIGKILL leaves in its temp folder stays here
    scratch.mkdir()
    child = subprocess.Popen(
        [*CLI, "process", killed.partition_key],
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        row = episode_db.episode_row(db_conn, killed)
        if row and row["status"] == "processing":
            break
        time.sleep(0.05)
    assert child.poll() is None, "the run finished before it could be killed"
    # The process and all it started (FFmpeg, compute-log tails) die at once, as in an OOM kill
    # of its container.
    root = psutil.Process(child.pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    child.wait()
    assert episode_db.episode_row(db_conn, killed)["status"] == "processing"

    assert process_episode(killed)  # also reports the killed run failed (orphaned)
    assert relative(state_of(db_conn, s3_client, stack.bucket, killed), killed) == relative(
        state_of(db_conn, s3_client, stack.bucket, reference), reference
    )
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    runs = DagsterInstance.get().get_runs(
        RunsFilter(tags={"dagster/partition": killed.partition_key})
    )
    assert sorted(run.status.value for run in runs) == sorted(
        [DagsterRunStatus.FAILURE.value, DagsterRunStatus.SUCCESS.value]
    )


def test_a_bad_info_json_field_fails_the_episode_naming_file_and_field(tmp_path, stack):
    folder = tmp_path / "dataset"
    write_dataset(folder, SampleSpec(codebase_version="v2.1", cameras=1, seconds=1.0))
    info_path = folder / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["fps"] = "thirty"
    info_path.write_text(json.dumps(info))
    archive = tmp_path / "bad-fps.tar.zst"
    pack_archive(folder, archive, root_folder="lerobot_episode")
    ref = new_ref()
    upload_episode(archive, ref)

    outcome = process_episode(ref)
    assert not outcome.success
    assert any("meta/info.json" in e and "'fps'" in e for e in outcome.errors), outcome.errors
    assert report_for(ref)["status"] == "failed"


def test_a_metadata_failure_after_processing_keeps_the_episode_processed(tmp_path, stack):
    folder = tmp_path / "dataset"
    write_dataset(folder, SampleSpec(codebase_version="v3.0", cameras=1, seconds=1.0))
    (folder / "meta" / "tasks.parquet").write_bytes(b"not a parquet file")
    archive = tmp_path / "bad-tasks.tar.zst"
    pack_archive(folder, archive, root_folder=None)
    ref = new_ref()
    upload_episode(archive, ref)

    outcome = process_episode(ref)
    assert outcome.success, outcome.errors  # recorded, not raised: the message can go
    report = report_for(ref)
    assert report["status"] == "processed"  # ... and, per the contract, the episode stays processed
    assert report["frames_rows"] == 30 and report["metadata"] == {}
    assert report["checks"]["metadata_keys_present"] is False
    error = latest_metadata(ref, "episode_metadata")["error"]
    assert "tasks.parquet" in error, error


REPO_ROOT = Path(__file__).resolve().parents[1]


def readme_command(marker: str, replace: dict[str, str]) -> list[str]:
    """The README's one command line containing `marker`, to run in bash as typed: `.venv/bin/`
    this interpreter's, and the example values replaced."""
    (line,) = [
        line
        for line in (REPO_ROOT / "README.md").read_text().splitlines()
        if marker in line and ".venv/bin/" in line and not line.startswith("#")
    ]
    line = line.split(" # ")[0].replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    for example, value in replace.items():
        line = line.replace(example, shlex.quote(value))
    return ["bash", "-c", line]


def test_dg_launch_reprocesses_one_episode(tmp_path, stack, db_conn, s3_client):
    ref, _ = uploaded(tmp_path, codebase_version="v3.0", cameras=1)
    assert process_episode(ref)
    before = state_of(db_conn, s3_client, stack.bucket, ref)
    # What the README tells an engineer to type, from the repository's root, with only
    # DAGSTER_HOME and no virtual environment activated (`.venv/bin/dg`), the stack's variables
    # taken from `eval "$(episode-pipeline stack env)"` as the README says.
    env = {k: v for k, v in os.environ.items() if k not in ("EPISODE_PIPELINE_HOME", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith(("DB_", "AWS_", "DATA_", "SQS_"))}
    command = readme_command("dg launch", {"acme/ep-42": ref.partition_key})
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Quiet: no virtual-environment warning, none of Dagster's DEBUG events; the steps' lines.
    assert "virtual environment" not in done.stdout + done.stderr
    assert " - DEBUG - " not in done.stderr and "STEP_START" not in done.stderr
    assert " - INFO - process_episode - " in done.stderr
    assert state_of(db_conn, s3_client, stack.bucket, ref) == before
    # Tagged as the sensor's runs are (docs/operations.md#reprocess-an-episode).
    (run,) = DagsterInstance.get().get_runs(
        RunsFilter(tags={"dagster/partition": ref.partition_key}), limit=1
    )
    assert run.job_name == "process_episode" and run.is_success
    assert (run.tags["org"], run.tags["episode"]) == (ref.org_id, ref.episode_id)
    # It counts as the run of the object version it read (docs/contract.md#upload-queue).
    listed = s3_client.list_objects_v2(Bucket=stack.bucket, Prefix=ref.prefix, Delimiter="/")
    (etag,) = [item["ETag"].strip('"') for item in listed["Contents"]]  # the archive alone
    assert run.tags[UPLOAD_TAG] == f"{ref.partition_key}@{etag}"
    assert "SupersessionWarning" not in done.stderr
