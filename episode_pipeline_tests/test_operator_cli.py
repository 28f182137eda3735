"""The operator's path on the real stack: `process` tells what it did quietly, and `status`
explains a failed episode (the run, the failing step's error, the failed checks, a UI link), for
a corrupt archive, a hostile one and a failed check; `status --failed` lists them by cause."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from episode_pipeline import cli
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support import new_ref
from episode_pipeline_tests.support.archives import with_members

pytestmark = pytest.mark.integration

ORG = "operator-org"  # `status --failed --org` sees only this module's episodes


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def sample_tar(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    import zstandard

    archive = tmp_path_factory.mktemp("operator") / "take.tar.zst"
    write_sample(archive, SampleSpec(seconds=1.0, cameras=1, root_folder="lerobot_episode"))
    return zstandard.ZstdDecompressor().decompressobj().decompress(archive.read_bytes())


def uploaded(tmp_path: Path, data: bytes, org: str = ORG) -> EpisodeRef:
    ref = new_ref(org)
    archive = tmp_path / "take.tar.zst"
    archive.write_bytes(data)
    upload_episode(archive, ref)
    return ref


def status_json(capsys: pytest.CaptureFixture, ref: EpisodeRef) -> dict[str, Any]:
    code, out, _ = run_cli(capsys, "status", ref.partition_key, "--json")
    assert code == 0
    (report,) = json.loads(out)
    return report


def test_a_corrupt_archive_is_explained_by_process_and_status(
    stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    ref = uploaded(tmp_path, b"\x01\x02not zstd at all" * 64)

    code, out, err = run_cli(capsys, "process", ref.partition_key)

    assert code == 1
    # The cause first, on stderr; Dagster's event log is not printed.
    first = err.splitlines()[0]
    assert first.startswith(f"episode-pipeline: {ref} failed: extracted_files: CorruptArchive:")
    assert "not a zstd stream" in first
    assert "DEBUG" not in out + err and "STEP_START" not in out + err
    steps = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:6]}
    assert steps == {
        "extracted_files": "FAILED",
        "frames": "not",
        "hls_renditions": "not",
        "episode": "not",
        "episode_metadata": "not",
    }
    log = Path(out.split("log: ")[1].strip())
    assert "STEP_FAILURE" in log.read_text() and "Stack Trace" in log.read_text()

    report = status_json(capsys, ref)
    run = report["latest_run"]
    assert report["status"] == "failed"
    assert run["run_status"] == "FAILURE" and run["job"] == "process_episode"
    assert run["run_url"].endswith(f"/runs/{run['run_id']}")
    (error,) = run["errors"]
    assert (error["step"], error["error_type"]) == ("extracted_files", "CorruptArchive")
    assert error["message"].startswith(f"s3://{stack.bucket}/{ref.prefix}take.tar.zst")
    assert run["cause"].startswith("extracted_files: CorruptArchive: ")

    code, text, _ = run_cli(capsys, "status", ref.partition_key)
    assert code == 0
    assert f"latest run {run['run_id']} (process_episode): FAILURE" in text
    assert "step extracted_files failed: CorruptArchive" in text
    assert run["run_url"] in text


def test_a_hostile_archive_and_a_failed_check_are_explained(
    sample_tar: bytes, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    hostile = uploaded(
        tmp_path, with_members(sample_tar, [("lerobot_episode/meta/info.json", b"{}")])
    )
    assert run_cli(capsys, "process", hostile.partition_key)[0] == 1
    (error,) = status_json(capsys, hostile)["latest_run"]["errors"]
    assert error["error_type"] == "DuplicateMember"
    assert "appears more than once" in error["message"]

    # A stale total_frames: the run succeeds, the WARN check fails and says what it saw.
    stale = tmp_path / "stale.tar.zst"
    write_sample(stale, SampleSpec(seconds=1.0, cameras=1, info_overrides={"total_frames": 999}))
    checked = uploaded(tmp_path, stale.read_bytes())
    code, out, _ = run_cli(capsys, "process", checked.partition_key)
    assert code == 0
    assert "checks: frame_count_matches_rows FAILED (WARN)" in out
    run = status_json(capsys, checked)["latest_run"]
    assert run["run_status"] == "SUCCESS" and run["errors"] == []
    (check,) = run["failed_checks"]
    assert (check["check"], check["asset"], check["severity"]) == (
        "frame_count_matches_rows",
        "episode",
        "WARN",
    )
    assert "total_frames" in check["description"]
    assert check["metadata"]["frame_count"] == "999"
    code, text, _ = run_cli(capsys, "status", checked.partition_key)
    assert "check frame_count_matches_rows (episode, WARN) failed" in text

    # Both failed episodes of the org, newest first, each with its cause on one line.
    code, text, _ = run_cli(capsys, "status", "--failed", "--org", ORG)
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith(hostile.partition_key) and "DuplicateMember" in lines[0]
    code, out, _ = run_cli(capsys, "status", "--failed", "--org", ORG, "--json")
    rows = {row["episode"]: row for row in json.loads(out)}
    assert checked.partition_key not in rows  # processed: a WARN check does not fail it
    assert rows[hostile.partition_key]["cause"].startswith("extracted_files: DuplicateMember:")


def test_status_of_an_episode_with_no_run_says_so(
    episode_row: Any, capsys: pytest.CaptureFixture
) -> None:
    ref = episode_row(ORG)
    run = status_json(capsys, ref)["latest_run"]
    assert run["run_id"] is None and run["cause"] is None
    assert "no run yet" in run_cli(capsys, "status", ref.partition_key)[1]


def test_status_without_an_episode_pages_the_newest_changed_episodes(
    episode_row: Any, db_conn: Any, capsys: pytest.CaptureFixture
) -> None:
    org = f"status-page-{uuid.uuid4().hex[:6]}"  # an org of this test's own
    oldest, middle, newest = (episode_row(org) for _ in range(3))
    db_conn.execute(
        "UPDATE episodes SET updated_at = now() - make_interval(secs => %s) WHERE id = %s",
        (3600, oldest.episode_id),
    )
    db_conn.execute(
        "UPDATE episodes SET updated_at = now() - make_interval(secs => %s) WHERE id = %s",
        (60, middle.episode_id),
    )
    code, out, _ = run_cli(capsys, "status", "--org", org, "--limit", "2", "--json")
    assert code == 0
    assert [r["episode_id"] for r in json.loads(out)] == [newest.episode_id, middle.episode_id]
    code, _, err = run_cli(capsys, "status", "--limit", "0")
    assert code == 2 and "--limit must be at least 1" in err


def test_check_only_an_unknown_check_lists_the_valid_names(
    episode_row: Any, capsys: pytest.CaptureFixture
) -> None:
    ref = episode_row(ORG)
    code, _, err = run_cli(capsys, "check", ref.partition_key, "--only", "bogus")
    assert code == 2
    assert "no such check(s): bogus" in err and "frames_match_parquet_rows" in err


def test_process_refuses_an_episode_nobody_uploaded_and_adds_no_partition(
    capsys: pytest.CaptureFixture,
) -> None:
    from dagster import DagsterInstance

    ref = new_ref(ORG)
    code, out, err = run_cli(capsys, "process", ref.partition_key)
    assert code == 2 and out == ""
    assert err.startswith(f"episode-pipeline: {ref}: no such episode:")
    assert f"episode-pipeline upload ARCHIVE --org {ref.org_id}" in err
    assert not DagsterInstance.get().has_dynamic_partition("episodes", ref.partition_key)


def test_dg_launch_names_a_partition_dagster_does_not_know() -> None:
    """docs/operations.md#reprocess-an-episode, typed as documented (from the project's root):
    an episode the sensor never saw is named, not a DagsterInvalidSubsetError. A known one is
    reprocessed in test_episode_graph.py::test_dg_launch_reprocesses_one_episode."""
    import os
    import subprocess
    import sys

    dg = Path(sys.executable).parent / "dg"
    missing = subprocess.run(
        [str(dg), "launch", "--job", "process_episode", "--partition", f"{ORG}/ep-never-seen"],
        cwd=Path(__file__).resolve().parents[1],  # the project: dg reads its pyproject.toml
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert missing.returncode != 0
    assert f"Could not find a partition with key `{ORG}/ep-never-seen`" in missing.stderr
    assert "DagsterInvalidSubsetError" not in missing.stderr
    assert "virtual environment" not in missing.stderr  # `.venv/bin/dg` is the project's own
