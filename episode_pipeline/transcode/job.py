"""The transcode's job and results, as they cross the Pipes boundary (pure, JSON-able).

One job per episode: every camera goes to one transcode process (one ECS task in production,
one subprocess locally), so an episode waits for one cold start, not one per camera. The asset
sends a `TranscodeJob` as Pipes extras; the process answers with one custom message per camera
(a `TranscodeResult`) as each camera finishes, so a camera that finished before the process was
killed still counts. Both sides import this module, so the field names are defined once; the
task size and the step's deadline are decided here too, from the same facts, and so is what a
camera's failure means (`describe_failure`): a file's own bad content, tolerated, or an
infrastructure error, after which the step is retried (`retry_wait`) and nothing is removed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from episode_pipeline.config.settings import SUBPROCESS, S3Deadlines, VideoSettings
from episode_pipeline.storage.aws import aws_fault
from episode_pipeline.video.hls import SEGMENT_SECONDS
from episode_pipeline.video.playlist import PlaylistError
from episode_pipeline.video.probe import ProbeError, VideoProbe
from episode_pipeline.video.process import DeadlineExceeded

RESULT_MESSAGE_TYPE = "hls_rendition"
# Time for the task to start and to move files, on top of the FFmpeg deadlines.
STEP_OVERHEAD_SECONDS = 600.0
UNKNOWN_EPISODE_SECONDS = 3600.0  # when info.json does not say how long the episode is
FARGATE_VCPUS = (1, 2, 4, 8, 16)
MIB_PER_VCPU = 2048  # the smallest memory Fargate pairs with each of those sizes


class TranscodeError(RuntimeError):
    """FFmpeg failed, or wrote a rendition that breaks the contract."""


class TranscodeFailed(RuntimeError):
    """The external process ended without reporting every camera."""


class TranscodeDeadlineExceeded(TranscodeFailed):
    """The whole transcode ran past its deadline: the subprocess was killed or the task stopped."""


class JobError(ValueError):
    """The extras do not describe a transcode job; the message names the field."""


def video_to_dict(video: VideoSettings) -> dict[str, Any]:
    """`VideoSettings` as JSON for the job's extras."""
    return {**asdict(video), "ladder": list(video.ladder)}


def video_from_dict(data: Mapping[str, Any]) -> VideoSettings:
    """The job's `VideoSettings`; a field the sender did not know keeps its default."""
    values = {f.name: data[f.name] for f in fields(VideoSettings) if f.name in data}
    if "ladder" in values:
        values["ladder"] = tuple(values["ladder"])
    return VideoSettings(**values)


def _field(extras: Mapping[str, Any], name: str, kind: type, where: str = "") -> Any:
    value = extras.get(name)
    if not isinstance(value, kind) or (isinstance(value, str | list) and not value):
        raise JobError(
            f"transcode job (Pipes extras): field {where}{name!r} must be a non-empty "
            f"{kind.__name__}, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class CameraJob:
    """One camera: its mp4s in play order → HLS renditions under `output_prefix`."""

    camera: str
    sources: list[str]  # S3 keys, concatenated in this order
    output_prefix: str  # ends with "/": orgs/<org>/episodes/<ep>/processed/hls/<camera>/

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], index: int) -> CameraJob:
        where = f"cameras[{index}]."
        sources = _field(data, "sources", list, where)
        if not all(isinstance(s, str) and s for s in sources):
            raise JobError(
                f"transcode job (Pipes extras): field {where}'sources' must list S3 keys, "
                f"got {sources!r}"
            )
        prefix = _field(data, "output_prefix", str, where)
        if not prefix.endswith("/") or not prefix.strip("/"):
            raise JobError(
                f"transcode job (Pipes extras): field {where}'output_prefix' must be a non-root "
                f"prefix ending in '/', got {prefix!r}"
            )
        return cls(
            camera=_field(data, "camera", str, where), sources=list(sources), output_prefix=prefix
        )


@dataclass(frozen=True)
class TranscodeJob:
    """One episode's cameras, and what to make of each (`VideoSettings`); the S3 calls' timeouts
    and tries are the run's (`S3Deadlines`), so the transcode gives up on S3 when the run would."""

    bucket: str
    cameras: list[CameraJob]
    video: VideoSettings = field(default_factory=VideoSettings)
    segment_seconds: int = SEGMENT_SECONDS
    s3_deadlines: S3Deadlines = field(default_factory=S3Deadlines)

    def to_extras(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "cameras": [asdict(camera) for camera in self.cameras],
            "video": video_to_dict(self.video),
            "segment_seconds": self.segment_seconds,
            "s3_deadlines": asdict(self.s3_deadlines),
        }

    @classmethod
    def from_extras(cls, extras: Mapping[str, Any]) -> TranscodeJob:
        cameras = _field(extras, "cameras", list)
        if not all(isinstance(camera, Mapping) for camera in cameras):
            raise JobError("transcode job (Pipes extras): field 'cameras' must list objects")
        seconds = extras.get("segment_seconds", SEGMENT_SECONDS)
        if not isinstance(seconds, int) or seconds < 1:
            raise JobError(
                "transcode job (Pipes extras): field 'segment_seconds' must be a positive "
                f"integer, got {seconds!r}"
            )
        video = extras.get("video") or {}
        if not isinstance(video, Mapping):
            raise JobError(
                f"transcode job (Pipes extras): field 'video' must be an object, got {video!r}"
            )
        deadlines = extras.get("s3_deadlines") or {}
        if not isinstance(deadlines, Mapping):
            raise JobError(
                "transcode job (Pipes extras): field 's3_deadlines' must be an object, got "
                f"{deadlines!r}"
            )
        known = {f.name for f in fields(S3Deadlines)}
        return cls(
            bucket=_field(extras, "bucket", str),
            cameras=[CameraJob.from_dict(c, i) for i, c in enumerate(cameras)],
            video=video_from_dict(video),
            segment_seconds=seconds,
            s3_deadlines=S3Deadlines(**{k: v for k, v in deadlines.items() if k in known}),
        )


# -- sizing the process ---------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSize:
    """An ECS task size (Fargate CPU units and MiB) for one episode's transcode."""

    cpu: int
    memory: int

    @property
    def vcpus(self) -> int:
        return self.cpu // 1024


def fargate_size(vcpus: int, max_vcpu: int) -> TaskSize:
    """The smallest Fargate size with at least `vcpus`, capped at `max_vcpu`, with 2 GiB per
    vCPU (a valid Fargate cpu/memory pair at every size)."""
    ceiling = max([v for v in FARGATE_VCPUS if v <= max(1, max_vcpu)], default=1)
    chosen = next((v for v in FARGATE_VCPUS if v >= vcpus), FARGATE_VCPUS[-1])
    chosen = min(chosen, ceiling)
    return TaskSize(cpu=chosen * 1024, memory=chosen * MIB_PER_VCPU)


def task_size(cameras: int, max_vcpu: int) -> TaskSize:
    """One vCPU per camera (cameras are encoded in parallel), rounded up to a Fargate size and
    capped at `max_vcpu`: a one-camera episode gets 1 vCPU, a three-camera one 4."""
    return fargate_size(cameras, max_vcpu)


def step_deadline(
    configured: float | None, video: VideoSettings, cameras: int, episode_seconds: float | None
) -> float:
    """How long the whole transcode may run: `configured` (TRANSCODE_DEADLINE_SECONDS), or time
    to start and move files plus every camera's FFmpeg deadline one after another (it catches a
    stuck process, not a slow one)."""
    if configured:
        return configured
    if episode_seconds is None or episode_seconds <= 0:
        episode_seconds = UNKNOWN_EPISODE_SECONDS
    return STEP_OVERHEAD_SECONDS + max(1, cameras) * video.ffmpeg_deadline(episode_seconds)


# -- what a failure means --------------------------------------------------------------------

# The file's own content (docs/contract.md: "a video error is logged and the episode can still be
# processed"): the camera is failed, its folder emptied, the episode goes on.
CONTENT = "content"
# S3 or any AWS call, the local disk, the transcode process dying or being stopped, the whole
# transcode's deadline, anything unforeseen: nothing is removed and the step fails, to be retried.
INFRASTRUCTURE = "infrastructure"
MAX_RETRY_WAIT_SECONDS = 300.0  # a Retry-After (or backoff) beyond this is cut to it

# FFmpeg failing or running past its own deadline on the file, a probe or playlist check failing
# (ValueError: what the video modules raise on a stream they cannot describe).
_CONTENT_ERRORS = (TranscodeError, DeadlineExceeded, PlaylistError, ProbeError, ValueError)


@dataclass(frozen=True)
class FailureFacts:
    """A camera's failure as its result carries it across the Pipes boundary."""

    kind: str  # CONTENT or INFRASTRUCTURE
    message: str  # names the S3 key, the error code and `Retry-After: N` when S3 said so
    code: str | None = None  # the AWS error code (SlowDown, ...) of an AWS failure
    retry_after_seconds: float | None = None


def describe_failure(error: BaseException) -> FailureFacts:
    """Content or infrastructure, and the text to report. An AWS error anywhere in the chain is
    infrastructure even when raised as something else; an exception nobody foresaw is
    infrastructure too (a bug is not a bad video: the step fails loudly, nothing is deleted)."""
    fault = aws_fault(error)
    if fault is not None:
        return FailureFacts(
            INFRASTRUCTURE, f"{error} [{fault.describe()}]", fault.code, fault.retry_after_seconds
        )
    if isinstance(error, _CONTENT_ERRORS):
        return FailureFacts(CONTENT, str(error))
    return FailureFacts(INFRASTRUCTURE, f"{type(error).__name__}: {error}")


def retry_wait(
    attempt: int, retries: int, base_seconds: float, retry_after: float | None
) -> float | None:
    """Seconds before the step's next try after an infrastructure failure on try `attempt`
    (0 the first), or None when that was the last: the Retry-After S3 gave, else exponential
    backoff from `base_seconds`; either cut to MAX_RETRY_WAIT_SECONDS."""
    if attempt >= retries:
        return None
    wait = retry_after if retry_after is not None else base_seconds * 2**attempt
    return min(max(0.0, wait), MAX_RETRY_WAIT_SECONDS)


def leftover_keys(existing: Iterable[str], written: Collection[str], prefix: str) -> list[str]:
    """The objects under a camera's `prefix` this run did not write (a longer earlier upload's
    extra segments, a rung no longer in the ladder): removed once the camera's master is up,
    never before, so an interrupted run leaves the earlier video whole."""
    return sorted(key for key in existing if key.startswith(prefix) and key not in written)


# -- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceVideo:
    key: str
    probe: VideoProbe


@dataclass(frozen=True)
class FailedVideo:
    key: str
    error: str


@dataclass(frozen=True)
class RenditionResult:
    """One uploaded rendition as the master playlist describes it."""

    name: str  # "baseline", "720p", ...
    playlist_key: str
    width: int
    height: int
    fps: float
    codecs: str
    bandwidth: int  # peak bit/s (RFC 8216)
    average_bandwidth: int
    segments: int
    seconds: float

    @property
    def resolution(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class StoryboardFacts:
    """A camera's uploaded storyboard (`video/storyboard.py`): the sprite, its VTT, the grid."""

    image_key: str
    vtt_key: str
    interval: int  # seconds between tiles
    tiles: int
    tile_width: int
    tile_height: int


@dataclass(frozen=True)
class TranscodeResult:
    """What one camera's transcode made; no playlist when it failed or no source was usable.

    `sources` are the mp4s that probed well, `failed` the ones that could not be downloaded or
    probed (left out); `error` says why the camera as a whole has no rendition (FFmpeg failed or
    ran late, a bad playlist, an upload failed, the process died) and `error_kind` whether that
    was the content's fault (CONTENT) or not (INFRASTRUCTURE: the step is retried).
    """

    camera: str
    playlist_key: str | None  # the baseline, processed/hls/<camera>/playlist.m3u8
    master_key: str | None = None
    poster_key: str | None = None
    storyboard: StoryboardFacts | None = None
    renditions: list[RenditionResult] = field(default_factory=list)
    seconds: float = 0.0  # the baseline's length, from its playlist
    sources: list[SourceVideo] = field(default_factory=list)
    failed: list[FailedVideo] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None  # CONTENT or INFRASTRUCTURE when `error` is set
    error_code: str | None = None  # the AWS error code of an AWS failure (SlowDown, ...)
    retry_after_seconds: float | None = None  # what S3 said to wait, if it did
    ffmpeg_seconds: float = 0.0  # wall time of FFmpeg alone
    started_at: float = 0.0  # epoch seconds: when the process took up this camera, and
    finished_at: float = 0.0  # when it was done with it

    @property
    def infrastructure_failed(self) -> bool:
        return self.error is not None and self.error_kind == INFRASTRUCTURE

    @property
    def source_duration_ms(self) -> int:
        return sum(s.probe.duration_ms for s in self.sources)

    @property
    def source_frames(self) -> int:
        return sum(s.probe.frames for s in self.sources)

    @property
    def segments(self) -> int:
        return sum(r.segments for r in self.renditions)

    def source_ranges(self) -> list[tuple[float, float]]:
        """Where each usable source plays in the camera's stream, in seconds: back to back in
        order, each lasting its probed duration (what FFmpeg's concat demuxer does; a file's own
        start time is not kept, so its first frame plays at its range's start)."""
        ranges, start = [], 0.0
        for source in self.sources:
            end = start + source.probe.duration_ms / 1000
            ranges.append((round(start, 3), round(end, 3)))
            start = end
        return ranges

    @property
    def baseline(self) -> RenditionResult | None:
        return next((r for r in self.renditions if r.playlist_key == self.playlist_key), None)

    def to_message(self) -> dict[str, Any]:
        return {"type": RESULT_MESSAGE_TYPE, "result": asdict(self)}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> TranscodeResult:
        data = dict(message["result"])
        return cls(
            camera=data["camera"],
            playlist_key=data.get("playlist_key"),
            master_key=data.get("master_key"),
            poster_key=data.get("poster_key"),
            storyboard=StoryboardFacts(**data["storyboard"]) if data.get("storyboard") else None,
            renditions=[RenditionResult(**r) for r in data.get("renditions", [])],
            seconds=float(data.get("seconds", 0.0)),
            sources=[
                SourceVideo(key=s["key"], probe=VideoProbe.from_dict(s["probe"]))
                for s in data.get("sources", [])
            ],
            failed=[FailedVideo(**f) for f in data.get("failed", [])],
            error=data.get("error"),
            # A result without a kind comes from a program older than the kinds: content, as then.
            error_kind=data.get("error_kind") or (CONTENT if data.get("error") else None),
            error_code=data.get("error_code"),
            retry_after_seconds=data.get("retry_after_seconds"),
            ffmpeg_seconds=float(data.get("ffmpeg_seconds", 0.0)),
            started_at=float(data.get("started_at", 0.0)),
            finished_at=float(data.get("finished_at", 0.0)),
        )


def find_results(messages: list[Any]) -> dict[str, TranscodeResult]:
    """Each camera's result among a session's custom messages (a camera's last one wins)."""
    found: dict[str, TranscodeResult] = {}
    for message in messages:
        if isinstance(message, Mapping) and message.get("type") == RESULT_MESSAGE_TYPE:
            result = TranscodeResult.from_message(message)
            found[result.camera] = result
    return found


@dataclass
class TranscodeOutcome:
    """Each reported camera's result, and why the process failed (None when it did not): always
    an infrastructure error, with the AWS code and Retry-After when ECS or CloudWatch refused."""

    results: dict[str, TranscodeResult] = field(default_factory=dict)
    error: str | None = None
    error_code: str | None = None
    retry_after_seconds: float | None = None
    deadline_seconds: float = 0.0
    task_size: TaskSize | None = None  # ECS only
    mode: str = SUBPROCESS
