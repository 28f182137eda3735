"""The pure video parts: the FFmpeg HLS command, level 3.0 sizing, playlists, the Pipes job."""

from __future__ import annotations

import pytest

from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.settings import ECS, SUBPROCESS, Settings
from episode_pipeline.transcode.job import (
    FailedVideo,
    JobError,
    SourceVideo,
    TranscodeJob,
    TranscodeResult,
    find_result,
)
from episode_pipeline.video.hls import (
    LEVEL_30_MAX_FRAME_MBS,
    LEVEL_30_MAX_MBS_PER_SECOND,
    concat_list,
    ffmpeg_command,
    fit_level_30,
)
from episode_pipeline.video.playlist import PlaylistError, check_playlist, parse_playlist
from episode_pipeline.video.probe import ProbeError, VideoProbe, probe

GOOD = """#EXTM3U
#EXT-X-VERSION:3
#EXT-X-TARGETDURATION:4
#EXT-X-MEDIA-SEQUENCE:0
#EXT-X-PLAYLIST-TYPE:VOD
#EXTINF:4.004000,
segment_00000.ts
#EXTINF:4.004000,
segment_00001.ts
#EXTINF:1.001000,
segment_00002.ts
#EXT-X-ENDLIST
"""
NAMES = {"segment_00000.ts", "segment_00001.ts", "segment_00002.ts", "playlist.m3u8"}


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_command_has_the_contract_settings():
    cmd = ffmpeg_command("ffmpeg", "in.mp4", "/out", width=640, height=480, fps=30)
    assert option(cmd, "-c:v") == "libx264"
    assert option(cmd, "-profile:v") == "baseline"
    assert option(cmd, "-level:v") == "3.0"
    assert option(cmd, "-pix_fmt") == "yuv420p"
    assert option(cmd, "-hls_time") == "4"
    assert option(cmd, "-hls_playlist_type") == "vod"
    assert option(cmd, "-force_key_frames") == "expr:gte(t,n_forced*4)"
    assert option(cmd, "-sc_threshold") == "0"
    assert option(cmd, "-g") == "120"
    assert option(cmd, "-i") == "in.mp4"
    assert "-an" in cmd
    assert "scale=640:480" in option(cmd, "-vf")
    assert cmd[-1] == "/out/playlist.m3u8"
    assert option(cmd, "-hls_segment_filename") == "/out/segment_%05d.ts"


def test_command_concat_and_audio():
    cmd = ffmpeg_command(
        "ffmpeg",
        "list.ffconcat",
        "/out",
        width=320,
        height=240,
        fps=30,
        has_audio=True,
        concat=True,
    )
    assert cmd[cmd.index("-i") - 4 : cmd.index("-i") + 2] == [
        "-f", "concat", "-safe", "0", "-i", "list.ffconcat",
    ]  # fmt: skip
    assert option(cmd, "-c:a") == "aac"
    assert "-an" not in cmd


def test_odd_sizes_become_even():
    out = fit_level_30(321, 241, 30)
    assert (out.width, out.height) == (320, 240)


@pytest.mark.parametrize(
    ("width", "height", "fps"),
    [(1280, 720, 30), (1920, 1080, 30), (640, 480, 60), (720, 576, 25), (3840, 2160, 15)],
)
def test_sizes_fit_level_30(width, height, fps):
    out = fit_level_30(width, height, fps)
    mbs = -(-out.width // 16) * -(-out.height // 16)
    assert mbs <= LEVEL_30_MAX_FRAME_MBS
    assert mbs * out.fps <= LEVEL_30_MAX_MBS_PER_SECOND
    assert out.width % 2 == 0 and out.height % 2 == 0
    assert abs(out.width / out.height - width / height) < 0.03
    assert out.fps <= 30


def test_small_sources_keep_size_and_rate():
    out = fit_level_30(640, 480, 30)
    assert (out.width, out.height, out.fps) == (640, 480, 30)
    cmd = ffmpeg_command("ffmpeg", "in.mp4", "/o", width=640, height=480, fps=60)
    assert "fps=30" in option(cmd, "-vf")


def test_concat_list_escapes_and_rejects_paths():
    assert concat_list(["a.mp4", "it's.mp4"]) == (
        "ffconcat version 1.0\nfile 'a.mp4'\nfile 'it'\\''s.mp4'\n"
    )
    with pytest.raises(ValueError, match="plain file name"):
        concat_list(["../x.mp4"])
    with pytest.raises(ValueError):
        concat_list([])


def test_good_playlist_passes():
    playlist = parse_playlist(GOOD)
    assert playlist.target_duration == 4
    assert playlist.endlist
    assert [s.uri for s in playlist.segments] == sorted(NAMES - {"playlist.m3u8"})
    assert playlist.seconds == pytest.approx(9.009)
    assert check_playlist(playlist, NAMES) == []


def test_missing_segment_and_endlist_are_reported():
    playlist = parse_playlist(GOOD.replace("#EXT-X-ENDLIST\n", ""))
    problems = check_playlist(playlist, NAMES - {"segment_00001.ts"})
    assert any("ENDLIST" in p for p in problems)
    assert any("segment_00001.ts is missing" in p for p in problems)


def test_long_segments_and_target_duration_are_reported():
    text = GOOD.replace("TARGETDURATION:4", "TARGETDURATION:9").replace("4.004000", "8.341667")
    problems = check_playlist(parse_playlist(text), NAMES)
    assert any("target duration 9" in p for p in problems)
    assert any("lasts 8.342 s" in p for p in problems)


def test_segment_outside_the_folder_is_reported():
    text = GOOD.replace("segment_00002.ts", "../other/segment_00002.ts")
    problems = check_playlist(parse_playlist(text), NAMES)
    assert any("not a plain name" in p for p in problems)


def test_not_a_playlist():
    with pytest.raises(PlaylistError, match=r"x\.m3u8: not an HLS playlist"):
        parse_playlist("<html>", source="x.m3u8")
    master = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1000\nlow/playlist.m3u8\n"
    with pytest.raises(PlaylistError, match="master playlist"):
        parse_playlist(master)


def test_job_round_trip_and_bad_fields():
    job = TranscodeJob(
        bucket="b",
        camera="observation.images.front",
        sources=["k1", "k2"],
        output_prefix="p/hls/c/",
    )
    assert TranscodeJob.from_extras(job.to_extras()) == job
    with pytest.raises(JobError, match="'bucket'"):
        TranscodeJob.from_extras({**job.to_extras(), "bucket": ""})
    with pytest.raises(JobError, match="'sources'"):
        TranscodeJob.from_extras({**job.to_extras(), "sources": []})
    with pytest.raises(JobError, match="'output_prefix'"):
        TranscodeJob.from_extras({**job.to_extras(), "output_prefix": "/"})


def test_result_message_round_trip():
    probe = VideoProbe(codec="av1", width=320, height=240, duration_ms=9000, frames=270, fps=30.0)
    result = TranscodeResult(
        camera="c",
        playlist_key="p/playlist.m3u8",
        segment_keys=["p/segment_00000.ts"],
        seconds=9.0,
        output_resolution="320x240",
        sources=[SourceVideo(key="k", probe=probe)],
        failed=[FailedVideo(key="k2", error="bad")],
    )
    assert find_result(["log line", {"type": "other"}, result.to_message()]) == result
    assert find_result([]) is None
    assert result.source_duration_ms == 9000


def transcoder_for(env: dict[str, str]) -> HlsTranscoder:
    """The transcoder Definitions builds from this environment."""
    settings = Settings.from_env({"DB_HOST": "db", "DATA_BUCKET": "data", **env})
    return HlsTranscoder.from_settings(settings)


def test_transcoder_from_env():
    assert transcoder_for({}).mode == SUBPROCESS
    env = {
        "TRANSCODE_TASK_DEFINITION": "pipe-transcode",
        "TRANSCODE_CONTAINER_NAME": "transcode",
        "ECS_CLUSTER": "pipe",
        "ECS_SUBNETS": "subnet-1, subnet-2",
        "ECS_SECURITY_GROUPS": "sg-1",
        "AWS_REGION": "eu-west-1",
    }
    transcoder = transcoder_for(env)
    assert transcoder.mode == ECS
    assert transcoder.region == "eu-west-1"
    params = transcoder.run_task_params()
    assert params["cluster"] == "pipe"
    assert params["taskDefinition"] == "pipe-transcode"
    assert params["launchType"] == "FARGATE"
    assert params["networkConfiguration"]["awsvpcConfiguration"] == {
        "subnets": ["subnet-1", "subnet-2"],
        "securityGroups": ["sg-1"],
        "assignPublicIp": "DISABLED",
    }
    assert params["overrides"]["containerOverrides"] == [{"name": "transcode"}]
    with pytest.raises(RuntimeError, match="ECS_SUBNETS"):
        transcoder_for({**env, "ECS_SUBNETS": ""})


def test_probe_names_the_unreadable_file(tmp_path):
    bad = tmp_path / "episode_000001.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x01" * 500)
    with pytest.raises(ProbeError, match=r"episode_000001\.mp4: not a readable video"):
        probe(bad)
