"""The pure video parts: the FFmpeg HLS command, level 3.0 sizing, the ladder, playlists and
master playlists, what the checks conclude, the Pipes job, the task size and deadlines."""

from __future__ import annotations

import sys

import pytest

from episode_pipeline.config.settings import (
    SUBPROCESS,
    LadderError,
    Settings,
    VideoSettings,
    parse_ladder,
)
from episode_pipeline.defs.resources.transcoder import HlsTranscoder
from episode_pipeline.transcode.job import (
    CameraJob,
    FailedVideo,
    JobError,
    RenditionResult,
    SourceVideo,
    TranscodeJob,
    TranscodeResult,
    find_results,
    step_deadline,
    task_size,
)
from episode_pipeline.video.hls import (
    LEVEL_30_MAX_FRAME_MBS,
    LEVEL_30_MAX_MBS_PER_SECOND,
    concat_list,
    fit_level_30,
    hls_command,
)
from episode_pipeline.video.ladder import (
    VariantStream,
    avc1_codec,
    average_bandwidth,
    master_playlist,
    peak_bandwidth,
    plan_renditions,
)
from episode_pipeline.video.playlist import (
    PlaylistError,
    Variant,
    check_master,
    check_playlist,
    parse_master,
    parse_playlist,
)
from episode_pipeline.video.probe import ProbeError, VideoProbe, probe
from episode_pipeline.video.verify import (
    SourceFacts,
    duration_problem,
    expected_frames,
    frame_count_problem,
    size_problem,
    upscale_problems,
)

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


def option(command: list[str], name: str, occurrence: int = 0) -> str:
    indexes = [i for i, arg in enumerate(command) if arg == name]
    return command[indexes[occurrence] + 1]


LADDER = ("source", "720", "480", "240")


def command_for(width=640, height=480, fps=30.0, ladder=LADDER, **kwargs):
    renditions = plan_renditions(width, height, fps, ladder)
    return renditions, hls_command(
        "ffmpeg",
        "in.mp4",
        "/out",
        renditions,
        source_width=width,
        source_height=height,
        source_fps=fps,
        **kwargs,
    )


def test_baseline_output_keeps_the_contract_settings():
    _, cmd = command_for(ladder=())
    assert option(cmd, "-c:v") == "libx264"
    assert option(cmd, "-profile:v") == "baseline"
    assert option(cmd, "-level:v") == "3.0"
    assert option(cmd, "-pix_fmt") == "yuv420p"
    assert option(cmd, "-hls_time") == "4"
    assert option(cmd, "-hls_playlist_type") == "vod"
    assert option(cmd, "-hls_flags") == "temp_file"
    assert option(cmd, "-force_key_frames") == "expr:gte(t,n_forced*4)"
    assert option(cmd, "-sc_threshold") == "0"
    assert option(cmd, "-g") == "120"
    assert option(cmd, "-i") == "in.mp4"
    assert "-an" in cmd
    assert option(cmd, "-filter_complex") == (
        "[0:v:0]scale=640:480:flags=bicubic,setsar=1,format=yuv420p[v0]"
    )
    assert cmd[-1] == "/out/playlist.m3u8"
    assert option(cmd, "-hls_segment_filename") == "/out/segment_%05d.ts"


def test_one_invocation_writes_every_rendition_and_the_poster():
    renditions, cmd = command_for(1280, 720, 30.0, poster=True)
    assert [r.name for r in renditions] == ["baseline", "720p", "480p", "240p"]
    graph = option(cmd, "-filter_complex")
    assert graph.startswith("[0:v:0]split=5[s0][s1][s2][s3][s4];")
    assert "[s1]scale=1280:720:flags=bicubic,setsar=1,format=yuv420p[v1]" in graph
    assert "[s4]trim=end_frame=1,scale=320:180:flags=bicubic,setsar=1,format=yuvj420p[v4]" in graph
    assert [option(cmd, "-map", i) for i in range(5)] == [f"[v{i}]" for i in range(5)]
    assert [option(cmd, "-profile:v", i) for i in range(4)] == ["baseline", "high", "high", "high"]
    assert cmd.count("-level:v") == 1  # x264 picks the rungs' levels
    outputs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-hls_segment_filename"]
    assert outputs == [
        "/out/segment_%05d.ts",
        "/out/720p/segment_%05d.ts",
        "/out/480p/segment_%05d.ts",
        "/out/240p/segment_%05d.ts",
    ]
    assert "/out/720p/index.m3u8" in cmd
    assert cmd[-10:] == [
        "-map", "[v4]", "-an", "-frames:v", "1", "-q:v", "4", "-update", "1", "/out/poster.jpg"
    ]  # fmt: skip


def test_command_concat_and_audio():
    _, cmd = command_for(320, 240, 30.0, has_audio=True, concat=True)
    assert cmd[cmd.index("-i") - 4 : cmd.index("-i") + 2] == [
        "-f", "concat", "-safe", "0", "-i", "in.mp4",
    ]  # fmt: skip
    assert option(cmd, "-c:a") == "aac"
    assert "-an" not in cmd


def test_a_reduced_rate_is_filtered_only_where_it_applies():
    renditions, cmd = command_for(640, 480, 60.0)
    assert [(r.name, r.fps) for r in renditions] == [
        ("baseline", 30.0), ("480p", 60.0), ("240p", 60.0)
    ]  # fmt: skip
    graph = option(cmd, "-filter_complex")
    assert "[s0]scale=640:480:flags=bicubic,fps=30,setsar=1" in graph
    assert "fps=" not in graph.split(";", 2)[2]
    assert [option(cmd, "-g", i) for i in range(3)] == ["120", "240", "240"]


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
        cameras=[
            CameraJob("observation.images.front", ["k1", "k2"], "p/hls/observation.images.front/"),
            CameraJob("wrist", ["k3"], "p/hls/wrist/"),
        ],
        video=VideoSettings(ladder=("source", "360"), ffmpeg="/opt/ffmpeg", camera_workers=2),
    )
    assert TranscodeJob.from_extras(job.to_extras()) == job
    extras = job.to_extras()
    camera = extras["cameras"][0]
    with pytest.raises(JobError, match="'bucket'"):
        TranscodeJob.from_extras({**extras, "bucket": ""})
    with pytest.raises(JobError, match="'cameras'"):
        TranscodeJob.from_extras({**extras, "cameras": []})
    with pytest.raises(JobError, match=r"cameras\[0\]\.'sources'"):
        TranscodeJob.from_extras({**extras, "cameras": [{**camera, "sources": []}]})
    with pytest.raises(JobError, match=r"cameras\[0\]\.'output_prefix'"):
        TranscodeJob.from_extras({**extras, "cameras": [{**camera, "output_prefix": "/"}]})


def test_result_messages_one_per_camera():
    probe = VideoProbe(codec="av1", width=320, height=240, duration_ms=9000, frames=270, fps=30.0)
    baseline = RenditionResult(
        name="baseline",
        playlist_key="p/playlist.m3u8",
        width=320,
        height=240,
        fps=30.0,
        codecs="avc1.42C01E",
        bandwidth=900_000,
        average_bandwidth=700_000,
        segments=3,
        seconds=9.0,
    )
    result = TranscodeResult(
        camera="c",
        playlist_key="p/playlist.m3u8",
        master_key="p/master.m3u8",
        poster_key="p/poster.jpg",
        renditions=[baseline],
        seconds=9.0,
        sources=[SourceVideo(key="k", probe=probe)],
        failed=[FailedVideo(key="k2", error="bad")],
        started_at=1.0,
        finished_at=2.0,
    )
    failed = TranscodeResult(camera="d", playlist_key=None, failed=[FailedVideo("k3", "x")])
    messages = ["log line", {"type": "other"}, result.to_message(), failed.to_message()]
    assert find_results(messages) == {"c": result, "d": failed}
    assert find_results([]) == {}
    assert (result.source_duration_ms, result.source_frames, result.segments) == (9000, 270, 3)
    assert result.baseline == baseline and failed.baseline is None


@pytest.mark.parametrize(
    ("cameras", "max_vcpu", "size"),
    [(1, 4, (1024, 2048)), (2, 4, (2048, 4096)), (3, 4, (4096, 8192)), (6, 4, (4096, 8192)),
     (6, 16, (8192, 16384)), (3, 3, (2048, 4096)), (0, 4, (1024, 2048))],
)  # fmt: skip
def test_task_size_follows_the_cameras(cameras, max_vcpu, size):
    found = task_size(cameras, max_vcpu)
    assert (found.cpu, found.memory) == size


def test_step_deadline_from_the_episode_or_the_setting():
    video = VideoSettings(ffmpeg_deadline_base_seconds=100, ffmpeg_deadline_per_source_second=10)
    assert video.ffmpeg_deadline(30) == 400
    assert step_deadline(None, video, cameras=3, episode_seconds=30) == 600 + 3 * 400
    assert step_deadline(None, video, cameras=1, episode_seconds=None) == 600 + 100 + 36_000
    assert step_deadline(45.0, video, cameras=3, episode_seconds=30) == 45.0


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
    # The task is available, but a run transcodes in its own task unless its tag says `ecs`.
    assert transcoder.mode == SUBPROCESS
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
    assert params["overrides"] == {"containerOverrides": [{"name": "transcode"}]}
    sized = transcoder.run_task_params(task_size(3, transcoder.max_vcpu))["overrides"]
    assert (sized["cpu"], sized["memory"]) == ("4096", "8192")
    with pytest.raises(RuntimeError, match="ECS_SUBNETS"):
        transcoder_for({**env, "ECS_SUBNETS": ""})


def test_video_settings_from_env_reach_the_job():
    env = {
        "TRANSCODE_LADDER": "source, 720p,360",
        "TRANSCODE_LADDER_PRESET": "superfast",
        "TRANSCODE_FFMPEG": "/opt/stand-in-ffmpeg",
        "TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS": "30",
        "TRANSCODE_PROBE_DEADLINE_SECONDS": "5",
        "TRANSCODE_CAMERA_WORKERS": "3",
        "TRANSCODE_DEADLINE_SECONDS": "900",
    }
    transcoder = transcoder_for(env)
    video = transcoder.job("b", []).video
    assert video == VideoSettings(
        ladder=("source", "720", "360"),
        ladder_preset="superfast",
        ffmpeg="/opt/stand-in-ffmpeg",
        ffmpeg_deadline_base_seconds=30.0,
        probe_deadline_seconds=5.0,
        camera_workers=3,
    )
    assert transcoder.deadline_seconds == 900.0
    assert transcoder_for({}).job("b", []).video == VideoSettings()
    assert transcoder_for({"TRANSCODE_LADDER": "none"}).ladder == []
    with pytest.raises(RuntimeError, match="TRANSCODE_LADDER: ladder rung 'hd'"):
        transcoder_for({"TRANSCODE_LADDER": "source,hd"})
    with pytest.raises(RuntimeError, match="TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS"):
        transcoder_for({"TRANSCODE_FFMPEG_DEADLINE_BASE_SECONDS": "soon"})


# -- the ladder ---------------------------------------------------------------------------------


def sizes(renditions) -> list[tuple[str, str, float, str]]:
    return [(r.name, r.resolution, r.fps, r.profile) for r in renditions]


def test_a_640x480_camera_gets_the_baseline_and_240p():
    assert sizes(plan_renditions(640, 480, 30, LADDER)) == [
        ("baseline", "640x480", 30, "baseline"),  # also the 480p and source rungs
        ("240p", "320x240", 30, "high"),
    ]


def test_the_ladder_never_goes_above_the_source():
    assert sizes(plan_renditions(1920, 1080, 30, LADDER)) == [
        ("baseline", "758x426", 30, "baseline"),
        ("1080p", "1920x1080", 30, "high"),
        ("720p", "1280x720", 30, "high"),
        ("480p", "852x480", 30, "high"),
        ("240p", "426x240", 30, "high"),
    ]
    assert sizes(plan_renditions(320, 240, 30, LADDER)) == [("baseline", "320x240", 30, "baseline")]
    assert sizes(plan_renditions(1000, 562, 25, ("1080", "720", "480"))) == [
        ("baseline", "850x478", 25, "baseline"),
        ("480p", "854x480", 25, "high"),
    ]
    for width, height, fps in [(1280, 720, 60), (854, 481, 29.97), (3840, 2160, 15)]:
        for rendition in plan_renditions(width, height, fps, LADDER):
            assert rendition.width <= width and rendition.height <= height
            assert rendition.fps <= fps
            assert rendition.width % 2 == rendition.height % 2 == 0


def test_rungs_keep_the_source_rate_and_an_empty_ladder_is_the_baseline_alone():
    assert sizes(plan_renditions(640, 480, 60, LADDER)) == [
        ("baseline", "640x480", 30, "baseline"),
        ("480p", "640x480", 60, "high"),
        ("240p", "320x240", 60, "high"),
    ]
    assert sizes(plan_renditions(1280, 720, 30, ())) == [("baseline", "756x424", 30, "baseline")]


def test_ladder_setting_syntax():
    assert parse_ladder("source, 720p ,480,,") == ("source", "720", "480")
    assert parse_ladder("") == parse_ladder("none") == ()
    for bad in ("hd", "-1", "8"):
        with pytest.raises(LadderError):
            parse_ladder(bad)


def test_peak_bandwidth_follows_rfc_8216():
    segments = [(500_000, 4.0), (1_000_000, 4.0), (60_000, 0.1)]
    # 0.1 s alone is under half the target; with the segment before it, 4.1 s counts.
    assert peak_bandwidth(segments, 4) == round(1_060_000 * 8 / 4.1)
    assert average_bandwidth(segments) == round(1_560_000 * 8 / 8.1)
    assert peak_bandwidth([(10_000, 1.0)], 4) == 80_000  # shorter than half a target: average


def test_codecs_come_from_the_sequence_parameter_set():
    baseline_sps = b"\x00\x00\x00\x01\x09\xf0\x00\x00\x00\x01\x67\x42\xc0\x1e\xda"
    assert avc1_codec(b"\x47\x40\x00" + baseline_sps) == "avc1.42C01E"
    assert avc1_codec(b"\x00\x00\x01\x67\x64\x00\x0d\xac") == "avc1.64000D"
    with pytest.raises(ValueError, match=r"no H\.264 sequence parameter set"):
        avc1_codec(b"\x00\x00\x01\x65\x88")


def test_master_playlist_round_trip_and_its_check():
    variants = [
        VariantStream("playlist.m3u8", 1_200_000, 900_000, 640, 480, 30.0, "avc1.42C01E"),
        VariantStream("240p/index.m3u8", 400_000, 300_000, 320, 240, 29.97, "avc1.64000D"),
    ]
    text = master_playlist(variants)
    assert "#EXT-X-STREAM-INF:BANDWIDTH=1200000,AVERAGE-BANDWIDTH=900000,RESOLUTION=640x480" in text
    parsed = parse_master(text)
    assert [(v.uri, v.bandwidth, v.resolution, v.codecs, v.frame_rate) for v in parsed] == [
        ("playlist.m3u8", 1_200_000, (640, 480), "avc1.42C01E", 30.0),
        ("240p/index.m3u8", 400_000, (320, 240), "avc1.64000D", 29.97),
    ]
    assert check_master(parsed, "playlist.m3u8") == []
    with pytest.raises(PlaylistError, match="a media playlist, expected a master"):
        parse_master(GOOD)
    bare = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1000\n../other/index.m3u8\n"
    problems = check_master(parse_master(bare), "playlist.m3u8")
    assert "the baseline rendition playlist.m3u8 is not listed" in problems
    assert "variant '../other/index.m3u8' is not a path inside the camera's folder" in problems
    assert "variant ../other/index.m3u8 lacks RESOLUTION, CODECS, FRAME-RATE" in problems


# -- what the checks conclude ---------------------------------------------------------------------


def facts(frames=45, fps=30.0, seconds=1.5, width=640, height=480) -> SourceFacts:
    return SourceFacts("k", width=width, height=height, fps=fps, frames=frames, seconds=seconds)


def test_drift_canary():
    assert duration_problem(3.4, [facts(), facts()]) is None
    assert duration_problem(2.4, [facts(), facts()]) == (
        "HLS lasts 2.400 s, the sources 3.000 s (drift -0.600 s > ±0.5 s)"
    )


def test_decoded_frames_against_the_sources():
    assert frame_count_problem(90, [facts(), facts()], 30.0) is None
    assert frame_count_problem(88, [facts(), facts()], 30.0) is None  # one per source
    assert "decoding gives 87 frames, the sources hold 90" in frame_count_problem(
        87, [facts(), facts()], 30.0
    )
    assert expected_frames([facts(frames=120, fps=60.0)], 30.0) == 60  # halved to level 3.0


def test_upscaling_and_claimed_sizes_are_caught():
    source = facts(width=640, height=480)
    fine = Variant("240p/index.m3u8", 1, 1, (320, 240), "avc1.64000D", 30.0)
    big = Variant("720p/index.m3u8", 1, 1, (960, 720), "avc1.64001F", 60.0)
    assert upscale_problems([fine], source) == []
    assert upscale_problems([big], source) == [
        "720p/index.m3u8: 960x720 exceeds the source's 640x480",
        "720p/index.m3u8: 60 fps exceeds the source's 30",
    ]
    assert size_problem((320, 240), (320, 240)) is None
    assert size_problem((320, 240), (640, 480)) == "decodes at 640x480, the master says 320x240"


def test_probe_names_the_unreadable_file(tmp_path):
    bad = tmp_path / "episode_000001.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x01" * 500)
    with pytest.raises(ProbeError, match=r"episode_000001\.mp4: not a readable video"):
        probe(bad)


def test_ffmpeg_is_found_bundled_or_on_path(monkeypatch, tmp_path):
    import imageio_ffmpeg

    from episode_pipeline.video import FFmpegNotFound, ffmpeg_exe

    assert ffmpeg_exe() == imageio_ffmpeg.get_ffmpeg_exe()
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # not installed
    system = tmp_path / "ffmpeg"
    system.write_text("#!/bin/sh\n")
    system.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ffmpeg_exe() == str(system)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(FFmpegNotFound, match="TRANSCODE_FFMPEG"):
        ffmpeg_exe()


def _jpeg(width: int, height: int) -> bytes:
    """A JPEG of a gradient with noise, as FFmpeg writes a poster."""
    import av
    import numpy as np

    rng = np.random.default_rng(7)
    ramp = np.linspace(0, 200, width, dtype=np.uint8)[None, :, None]
    pixels = (ramp + rng.integers(0, 55, (height, width, 3), dtype=np.uint8)).astype(np.uint8)
    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format="yuvj420p")
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuvj420p"
    return b"".join(bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)])


def test_the_inline_thumbnail_is_a_smaller_jpeg_of_the_poster_at_its_aspect():
    import io

    import av

    from episode_pipeline.video.thumbnail import THUMBNAIL_WIDTH, thumbnail_jpeg

    poster = _jpeg(320, 180)
    thumbnail = thumbnail_jpeg(poster)
    with av.open(io.BytesIO(thumbnail)) as container:
        frame = next(container.decode(video=0))
    assert (frame.width, frame.height) == (THUMBNAIL_WIDTH, 90)
    assert len(thumbnail) < len(poster) / 2
    narrow = _jpeg(120, 90)
    assert thumbnail_jpeg(narrow) == narrow  # never scaled up
    assert thumbnail_jpeg(b"not a jpeg") == b"not a jpeg"  # the UI shows what there is
