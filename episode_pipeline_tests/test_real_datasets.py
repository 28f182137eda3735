"""LeRobot datasets as they come from the field, each processed end to end on the real stack.

Every test writes its own small archive with the sample writer's options for one class of
real-world difference (docs/lerobot-archives.md), uploads it and runs the whole graph with
`process_episode`. Samples are 1 second with at most one camera, to keep the module fast.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.lerobot.features import STATE_RULE
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.runner import ProcessOutcome, process_episode
from episode_pipeline.samples.writer import SampleSpec, pack_archive, write_dataset
from episode_pipeline_tests.support.graph import check_evaluation, latest_metadata, report_for

pytestmark = pytest.mark.integration


def process(
    tmp_path: Path, spec: SampleSpec, extra_members: Sequence[tuple[str | bytes, bytes]] = ()
) -> tuple[EpisodeRef, dict, ProcessOutcome, Path]:
    """Write the dataset (plus `extra_members`), archive, upload and process it in-process."""
    folder = tmp_path / "dataset"
    summary = write_dataset(folder, spec)
    archive = tmp_path / "take.tar.zst"
    pack_archive(folder, archive, root_folder=spec.root_folder, extra_members=extra_members)
    ref = EpisodeRef("field-org", f"ep-{uuid.uuid4().hex[:10]}")
    upload_episode(archive, ref)
    return ref, summary, process_episode(ref), folder


def frame_rows(db_conn, ref: EpisodeRef) -> list[tuple]:
    return db_conn.execute(
        "SELECT frame_order, observation, action FROM frames WHERE episode_id = %s"
        " ORDER BY frame_order",
        (ref.episode_id,),
    ).fetchall()


def camera_summary(ref: EpisodeRef, camera: str) -> dict:
    """One camera's entry of the `hls_renditions` metadata `per_camera` (a table or a mapping)."""
    per_camera = latest_metadata(ref, "hls_renditions")["per_camera"]
    if hasattr(per_camera, "records"):
        return next(r.data for r in per_camera.records if r.data.get("camera") == camera)
    return per_camera[camera]


@pytest.mark.parametrize(
    ("version", "state", "action", "names"),
    [
        ("v2.0", "state", "actions", "dict"),
        ("v3.0", "observation.joint_state", "action", "nested"),
    ],
)
def test_state_and_action_under_other_names(
    tmp_path, stack, db_conn, version, state, action, names
):
    spec = SampleSpec(
        version, cameras=0, seconds=1.0, state_key=state, action_key=action, names_style=names
    )
    ref, summary, outcome, folder = process(tmp_path, spec)

    assert outcome, outcome.errors
    report = report_for(ref)
    assert report["status"] == "processed"
    assert report["metadata"]["codebase_version"] == version
    assert report["frames_rows"] == summary["total_frames"] == 30
    assert all(report["checks"].values()), report["checks"]
    (data_file,) = summary["data_files"]
    source = pq.read_table(folder / data_file).slice(7, 1).to_pylist()[0]
    _, observation, written_action = frame_rows(db_conn, ref)[7]
    assert observation == {"state": pytest.approx(source[state])}
    assert written_action == pytest.approx(source[action])
    metadata = latest_metadata(ref, "frames")
    assert (metadata["state_feature"], metadata["action_feature"]) == (state, action)


def test_no_state_feature_still_writes_every_row_and_a_warn_check_names_it(
    tmp_path, stack, db_conn
):
    spec = SampleSpec(
        "v2.1", cameras=0, seconds=1.0, episodes=2, state_key=None, names_style="null"
    )
    ref, summary, outcome, _ = process(tmp_path, spec)

    assert outcome, outcome.errors
    report = report_for(ref)
    assert report["status"] == "processed"
    rows = frame_rows(db_conn, ref)
    assert len(rows) == summary["total_frames"] == 60  # one row per parquet row, never empty
    assert {str(observation) for _, observation, _ in rows} == {str({"state": None})}
    assert all(action is not None for _, _, action in rows)
    failed = {name for name, passed in report["checks"].items() if not passed}
    assert failed == {"frames_state_present"}
    evaluation = check_evaluation(ref, "frames", "frames_state_present")
    assert evaluation.severity.value == "WARN"
    info_json = ref.processed_key("lerobot_episode/meta/info.json")
    assert evaluation.description == f"{info_json}: no state feature ({STATE_RULE})"


def test_videos_outside_the_template_folder_and_a_wrong_codec_claim(tmp_path, stack):
    # info.json says videos/… and AV1; the files sit under video/ and are H.264.
    spec = SampleSpec(
        "v3.0", cameras=1, seconds=1.0, codec="h264", video_folder="video", claimed_codec="av1"
    )
    ref, summary, outcome, _ = process(tmp_path, spec)

    assert outcome, outcome.errors
    report = report_for(ref)
    assert report["status"] == "processed"
    assert all(report["checks"].values()), report["checks"]
    (video,) = summary["video_files"]
    assert video.startswith("video/observation.images.front/")
    (rendition,) = report["hls"]
    assert rendition["camera"] == "observation.images.front"  # named by its feature folder
    assert rendition["source"] == ref.processed_key(f"lerobot_episode/{video}")
    assert camera_summary(ref, "observation.images.front")["source_codec"] == "h264"  # probed


def test_stale_totals_and_more_data_episodes_than_videos(tmp_path, stack):
    spec = SampleSpec(
        "v2.1",
        cameras=1,
        seconds=1.0,
        episodes=3,
        video_episodes=1,
        info_overrides={"total_frames": 45, "total_episodes": 7},
    )
    ref, summary, outcome, _ = process(tmp_path, spec)

    assert outcome, outcome.errors
    report = report_for(ref)
    assert report["status"] == "processed"
    assert report["frames_rows"] == summary["total_frames"] == 90  # every data row
    assert report["frame_count"] == 45  # the contract: frame_count is info.json's total_frames
    failed = {name for name, passed in report["checks"].items() if not passed}
    # WARN: the stale total is flagged; and episodes 1 and 2 have rows but no video, which
    # LeRobot could not load as (row, frame) pairs: the sync check names both.
    assert failed == {"frame_count_matches_rows", "video_frames_in_sync"}
    sync = check_evaluation(ref, "hls_renditions", "video_frames_in_sync")
    camera = "observation.images.front"
    assert sync.metadata["findings"].value == [
        f"episode {e}, camera {camera}: no video of camera {camera} for this episode"
        for e in (1, 2)
    ]
    assert camera_summary(ref, "observation.images.front")["sources"] == 1
    assert latest_metadata(ref, "hls_renditions")["failed_videos"] == []


@pytest.mark.parametrize(
    ("member", "named"),
    [
        (  # a second copy of the data file: which one is the dataset's?
            ("data/chunk-000/file-000.parquet", b"PAR1 another take PAR1"),
            "member 'lerobot_episode/data/chunk-000/file-000.parquet' appears more than once",
        ),
        ((b"videos/caf\xe9.mp4", b""), r"member name b'lerobot_episode/videos/caf\xe9.mp4'"),
    ],
    ids=["duplicate", "not-utf-8"],
)
def test_hostile_member_names_are_refused_naming_the_member(tmp_path, stack, member, named):
    spec = SampleSpec("v3.0", cameras=0, seconds=1.0)
    ref, _, outcome, _ = process(tmp_path, spec, extra_members=[member])

    assert not outcome
    assert any(e.startswith("extracted_files:") and named in e for e in outcome.errors), (
        outcome.errors
    )
    assert report_for(ref)["status"] == "failed"
