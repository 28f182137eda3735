"""`video_frames_in_sync` through the real stack: samples the project writes, each broken one way.

One module-scoped fixture uploads and processes every sample once (1-second episodes at
160x120); the tests read the check's evaluation the run recorded.
"""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
from pathlib import Path

import av
import pytest

from episode_pipeline.cli import main
from episode_pipeline.db.connection import connect
from episode_pipeline.db.outputs import output_record
from episode_pipeline.defs.checks.sync import CHECK_NAME
from episode_pipeline.episodes.hls_tables import STORYBOARD_METADATA_PREFIX
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.report import format_reports
from episode_pipeline.runner import process_episode
from episode_pipeline.samples.writer import SampleSpec, pack_archive, write_dataset
from episode_pipeline_tests.support.graph import check_evaluation, latest_metadata, report_for
from episode_pipeline_tests.test_storyboard_pure import cues

pytestmark = pytest.mark.integration

FRONT, WRIST = "observation.images.front", "observation.images.wrist"
SMALL = {"seconds": 1.0, "width": 160, "height": 120}
SAMPLES = {
    "good_v21": SampleSpec("v2.1", cameras=1, episodes=2, **SMALL),
    "good_v30": SampleSpec("v3.0", cameras=2, episodes=3, **SMALL),
    # front short by 10 %, wrist stamped 0.5 s late, episode 1 missing its row 10
    "broken_v21": SampleSpec(
        "v2.1",
        cameras=2,
        episodes=2,
        short_cameras={0: 0.1},
        late_cameras={1: 0.5},
        dropped_rows=[(1, 10)],
        **SMALL,
    ),
    "range_v30": SampleSpec("v3.0", cameras=1, episodes=2, range_end_offsets={1: 1.0}, **SMALL),
    "no_table_v30": SampleSpec("v3.0", cameras=1, episodes=2, **SMALL),
    "bad_table_v30": SampleSpec("v3.0", cameras=1, episodes=2, **SMALL),
}
EPISODES_TABLE = "meta/episodes/chunk-000/file-000.parquet"


def upload(tmp: Path, name: str, spec: SampleSpec) -> EpisodeRef:
    folder = tmp / name
    write_dataset(folder, spec)
    if name == "no_table_v30":
        (folder / EPISODES_TABLE).unlink()
    if name == "bad_table_v30":
        (folder / EPISODES_TABLE).write_bytes(b"PAR1 not a table PAR1")
    archive = tmp / f"{name}.tar.zst"
    pack_archive(folder, archive, root_folder=spec.root_folder)
    ref = EpisodeRef("sync-org", f"ep-{uuid.uuid4().hex[:10]}")
    upload_episode(archive, ref)
    return ref


@pytest.fixture(scope="module")
def processed(stack, tmp_path_factory) -> dict[str, EpisodeRef]:
    tmp = tmp_path_factory.mktemp("sync")
    refs = {name: upload(tmp, name, spec) for name, spec in SAMPLES.items()}
    for name, ref in refs.items():
        outcome = process_episode(ref)
        assert outcome, (name, outcome.errors)  # WARN: every sample is still processed
    return refs


def evaluation(ref: EpisodeRef):
    return check_evaluation(ref, "hls_renditions", CHECK_NAME)


def findings(ref: EpisodeRef) -> list[str]:
    return evaluation(ref).metadata["findings"].value


def table_rows(ref: EpisodeRef) -> list[dict]:
    return [record.data for record in evaluation(ref).metadata["per_episode_camera"].records]


@pytest.mark.parametrize("name", ["good_v21", "good_v30"])
def test_good_archives_pass_with_a_row_per_episode_and_camera(processed, name):
    ref = processed[name]
    result = evaluation(ref)
    assert result.passed, findings(ref)
    assert result.severity.value == "WARN"
    spec = SAMPLES[name]
    rows = table_rows(ref)
    assert len(rows) == spec.episodes * spec.cameras
    assert {(r["rows"], r["frames"], r["drift_frames"]) for r in rows} == {(30, 30, 0)}
    assert all(report_for(ref)["checks"].values()), report_for(ref)["checks"]


def test_short_late_and_gap_are_named_by_episode_and_camera(processed):
    ref = processed["broken_v21"]
    result = evaluation(ref)
    assert not result.passed and result.severity.value == "WARN"
    found = findings(ref)
    for episode, rows in ((0, 30), (1, 29)):
        front = f"episode {episode}, camera {FRONT}: "
        assert any(
            f.startswith(front) and f"episode_{episode:06d}.mp4: 27 frames for {rows} rows" in f
            for f in found
        ), found
        wrist = f"episode {episode}, camera {WRIST}: "
        assert any(
            f.startswith(wrist) and "starts late" in f and "+0.500 s, +15 frames" in f
            for f in found
        ), found
    assert not any(f.startswith("episode 0, camera") and "timestamps" in f for f in found)
    assert any(
        f.startswith("episode 1: timestamps not spaced") and "between rows 9 and 10" in f
        for f in found
    ), found
    by_cell = {(r["episode"], r["camera"]): r for r in table_rows(ref)}
    assert by_cell[(0, FRONT)]["drift_frames"] == -3
    assert by_cell[(0, WRIST)]["start_offset_seconds"] == pytest.approx(0.5)
    assert by_cell[(1, WRIST)]["timestamps"].startswith("timestamps not spaced")
    assert result.description.startswith(found[0])  # the first findings, in the UI's summary


def test_a_v30_range_off_by_a_second_fails_only_its_episode(processed):
    ref = processed["range_v30"]
    (finding,) = findings(ref)
    assert finding.startswith(f"episode 1, camera {FRONT}: ")
    assert "lasts 2.000 s, the 30 rows 1.000 s (offset +1.000 s, +30 frames)" in finding
    passed = {r["episode"]: r["passed"] for r in table_rows(ref)}
    assert passed == {0: True, 1: False}


def test_a_v30_archive_without_its_episodes_table_is_a_named_finding(processed):
    ref = processed["no_table_v30"]
    (finding,) = findings(ref)
    assert "no v3.0 episodes table" in finding and "assumed back to back" in finding
    assert [r["frames"] for r in table_rows(ref)] == [30, 30]  # still compared


def test_an_unreadable_episodes_table_is_named_not_a_crash(processed):
    ref = processed["bad_table_v30"]
    unreadable, no_table = findings(ref)
    assert unreadable.startswith(ref.processed_key(f"lerobot_episode/{EPISODES_TABLE}"))
    assert "unreadable episodes table" in unreadable
    assert "no v3.0 episodes table" in no_table


def test_status_and_check_show_the_sync_result(processed, capsys):
    ref = processed["range_v30"]
    report = report_for(ref)
    assert report["checks"][CHECK_NAME] is False
    assert report["sync"]["failing"] == [f"episode 1 / {FRONT}"]
    assert f"1 finding(s): episode 1 / {FRONT}" in format_reports([report])
    assert "ok" in format_reports([report_for(processed["good_v30"])]).splitlines()[1]
    capsys.readouterr()
    # `episode-pipeline check`: recomputed from the stores, the findings under the failed check
    assert main(["check", ref.partition_key, "--only", CHECK_NAME]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"FAILED  {CHECK_NAME}"
    assert out[1].strip().startswith(f"episode 1, camera {FRONT}: ") and "lasts 2.000 s" in out[1]


def test_the_blocking_setting_fails_the_episode(processed, settings):
    ref = processed["range_v30"]
    outcome = process_episode(ref, settings=dataclasses.replace(settings, sync_check_blocking=True))
    assert not outcome
    assert evaluation(ref).severity.value == "ERROR"
    assert report_for(ref)["status"] == "failed"


def test_storyboards_and_the_timeline_are_written_with_every_source_and_finding(
    processed, s3_client, stack
):
    """Two cameras of two v2.1 episode files each, one short, one late, a row missing: the
    storyboards and `timeline.json` read back from S3 (written before the row said processed,
    and kept by the leftover rule), every source named with its place in the stream."""
    ref = processed["broken_v21"]

    def get(key: str) -> bytes:
        return s3_client.get_object(Bucket=stack.bucket, Key=key)["Body"].read()

    hls = latest_metadata(ref, "hls_renditions")
    sources = {
        (r.data["camera"], r.data["key"].rsplit("/", 1)[-1]): r.data for r in hls["sources"].records
    }
    assert sorted(sources) == [
        (camera, f"episode_{e:06d}.mp4") for camera in (FRONT, WRIST) for e in (0, 1)
    ]
    front0, front1 = (sources[(FRONT, f"episode_{e:06d}.mp4")] for e in (0, 1))
    assert front0["stream_start_seconds"] == 0.0
    assert front1["stream_start_seconds"] == front0["stream_end_seconds"] == pytest.approx(0.9)
    for camera in (FRONT, WRIST):
        prefix = ref.hls_prefix(camera)
        found = cues(get(prefix + "storyboard.vtt").decode())
        with av.open(io.BytesIO(get(prefix + "storyboard.jpg"))) as sprite:
            frame = next(sprite.decode(video=0))
        assert (frame.width, frame.height) == (len(found) * 160, 120)  # one row of 160x120 tiles
        assert found[0][2] == "storyboard.jpg#xywh=0,0,160,120" and found[0][0] == 0.0
        shown = hls[STORYBOARD_METADATA_PREFIX + camera]
        assert shown.startswith(f"![{camera} storyboard](http") and len(shown) < 1000

    timeline = json.loads(get(ref.processed_prefix + "timeline.json"))
    assert latest_metadata(ref, "episode")["timeline"].startswith("http")
    assert [c["name"] for c in timeline["cameras"]] == [FRONT, WRIST]
    assert [len(c["sources"]) for c in timeline["cameras"]] == [2, 2]
    first, second = timeline["episodes"]
    assert (first["frames"], second["frames"]) == (30, 29)
    assert first["series"]["sampling"] == "every_frame" and len(first["series"]["t"]) == 30
    assert len(first["series"]["state"]["values"][0]) == 30
    # the late wrist: its first frame plays at the stream's 0, which row t = 0.5 wants
    wrist = first["cameras"][WRIST]
    assert (wrist["start"], wrist["offset"]) == (0.0, pytest.approx(-0.5, abs=0.02))
    assert second["cameras"][FRONT]["start"] == pytest.approx(0.9)
    spans = {
        (f["camera"], "late" if "late" in f["message"] else "short" if "short" in f["message"]
         else "gap" if "timestamps" in f["message"] else "other"): (f["start"], f["end"])
        for f in second["findings"]
    }  # fmt: skip
    assert spans[(WRIST, "late")] == (0.0, pytest.approx(0.5))
    assert spans[(FRONT, "short")][1] == pytest.approx(29 / 30 + 1 / 30, abs=0.04)
    assert spans[(None, "gap")] == (pytest.approx(9 / 30), pytest.approx(11 / 30))


def test_the_episode_record_keeps_the_sync_findings_of_its_run(processed, settings):
    """`episode` records the sync check's findings of the same run (the campaign's canary
    compares them across code versions): read through the partition's runs, by check key."""
    with connect(settings.database) as conn:
        for name in ("good_v30", "broken_v21"):
            record = output_record(conn, processed[name])
            assert record is not None, name
            assert record["figures"]["sync_findings"] == len(findings(processed[name])), name
