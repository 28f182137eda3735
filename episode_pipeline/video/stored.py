"""A camera's HLS as S3 holds it, read back and checked (what the asset checks run).

Everything is recomputed from the stored objects: the master and media playlists are parsed
again, segment names are matched against the listing, and the baseline is downloaded and decoded
end to end in a PyAV child under a deadline (`probe.examine`), the cameras side by side. The
sources' facts (`SourceFacts`) come from the caller: probing them again would mean downloading
every mp4 a second time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.hls import PLAYLIST_NAME, fit_level_30
from episode_pipeline.video.ladder import MASTER_NAME
from episode_pipeline.video.playlist import (
    Playlist,
    PlaylistError,
    Variant,
    check_master,
    check_playlist,
    parse_master,
    parse_playlist,
)
from episode_pipeline.video.probe import COUNT_FRAMES, PROBE, VideoProbe, examine
from episode_pipeline.video.verify import (
    SourceFacts,
    duration_problem,
    frame_count_problem,
    size_problem,
    upscale_problems,
)

DOWNLOAD_WORKERS = 8
# Decoding H.264 runs far faster than real time: a generous ceiling, not an estimate.
DECODE_DEADLINE_BASE_SECONDS = 60.0
DECODE_DEADLINE_PER_HLS_SECOND = 1.0


def folder_of(uri: str) -> str:
    """`240p/index.m3u8` → `240p/`; `playlist.m3u8` → ``."""
    return uri.rsplit("/", 1)[0] + "/" if "/" in uri else ""


@dataclass
class StoredCamera:
    """One camera's folder `prefix` in the bucket; each object is read at most once."""

    bucket: Bucket
    prefix: str
    _texts: dict[str, str | None] = field(default_factory=dict)

    @cached_property
    def names(self) -> set[str]:
        """Every object below the prefix, relative to it."""
        return {key[len(self.prefix) :] for key in self.bucket.list_keys(self.prefix)}

    def text(self, uri: str) -> str | None:
        if uri not in self._texts:
            present = uri in self.names
            self._texts[uri] = (
                self.bucket.get_bytes(self.prefix + uri).decode("utf-8", "replace")
                if present
                else None
            )
        return self._texts[uri]

    def media(self, uri: str) -> Playlist | str:
        """A media playlist, or what stops reading it (named by key)."""
        text = self.text(uri)
        if text is None:
            return f"{self.prefix}{uri}: missing"
        try:
            return parse_playlist(text, source=self.prefix + uri)
        except PlaylistError as error:
            return str(error)

    def master(self) -> list[Variant] | str:
        text = self.text(MASTER_NAME)
        if text is None:
            return f"{self.prefix}{MASTER_NAME}: missing"
        try:
            return parse_master(text, source=self.prefix + MASTER_NAME)
        except PlaylistError as error:
            return str(error)

    def variants(self) -> list[Variant]:
        """The master's variants ([] when it is unreadable: the playlists check says why)."""
        master = self.master()
        return [] if isinstance(master, str) else master

    def download(self, uri: str, into: Path, first_segment_only: bool = False) -> Path | str:
        """A media playlist and its segments into `into` (the same layout below it)."""
        playlist = self.media(uri)
        if isinstance(playlist, str):
            return playlist
        folder = folder_of(uri)
        segments = playlist.segments[:1] if first_segment_only else playlist.segments
        missing = [s.uri for s in segments if folder + s.uri not in self.names]
        if missing:
            return f"{self.prefix}{uri}: segment(s) missing: {', '.join(missing[:5])}"
        local = into / uri
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(self.text(uri) or "")
        with ThreadPoolExecutor(max_workers=DOWNLOAD_WORKERS) as pool:
            downloads = [
                pool.submit(self.bucket.download_file, f"{self.prefix}{folder}{s.uri}", path)
                for s in segments
                for path in [local.parent / s.uri]
            ]
        for download in downloads:
            download.result()
        return local.parent / segments[0].uri if first_segment_only else local


def playlist_problems(camera: StoredCamera, sources: Sequence[SourceFacts]) -> list[str]:
    """The master and every media playlist it lists parse and keep the contract; no variant
    claims more than the source; every listed segment exists."""
    problems = []
    master = camera.master()
    variants = [] if isinstance(master, str) else master
    if isinstance(master, str):
        problems.append(master)
    else:
        found = check_master(variants, PLAYLIST_NAME)
        problems += [f"{camera.prefix}{MASTER_NAME}: {p}" for p in found]
    if sources:
        problems += [f"{camera.prefix}{p}" for p in upscale_problems(variants, sources[0])]
    for uri in dict.fromkeys([PLAYLIST_NAME, *(v.uri for v in variants)]):
        playlist = camera.media(uri)
        if isinstance(playlist, str):
            problems.append(playlist)
            continue
        folder = folder_of(uri)
        present = {n[len(folder) :] for n in camera.names if n.startswith(folder)}
        problems += [f"{camera.prefix}{uri}: {p}" for p in check_playlist(playlist, present)]
    return problems


def drift_problems(camera: StoredCamera, sources: Sequence[SourceFacts]) -> list[str]:
    """The drift canary on the baseline: its playlist's length against the sources' total."""
    playlist = camera.media(PLAYLIST_NAME)
    if isinstance(playlist, str):
        return [playlist]
    problem = duration_problem(playlist.seconds, sources)
    return [f"{camera.prefix}{PLAYLIST_NAME}: {problem}"] if problem else []


def baseline_fps(sources: Sequence[SourceFacts]) -> float:
    """The baseline's rate: the first source's, fitted to level 3.0 as the transcode did."""
    first = sources[0] if sources else None
    return fit_level_30(first.width, first.height, first.fps).fps if first else 0.0


@dataclass(frozen=True)
class DecodeRequest:
    """One file the decode child examines: a camera's baseline playlist (its frames counted) or
    a variant's first segment (probed for its size)."""

    camera: str
    uri: str
    mode: str  # COUNT_FRAMES | PROBE
    local: Path
    variant: Variant | None = None  # None: the baseline


def download_for_decoding(name: str, camera: StoredCamera, into: Path) -> list[DecodeRequest] | str:
    """The camera's baseline with every segment, and each variant's first segment, into `into`;
    what stops the baseline's download is returned instead."""
    local = camera.download(PLAYLIST_NAME, into)
    if isinstance(local, str):
        return local
    requests = [DecodeRequest(name, PLAYLIST_NAME, COUNT_FRAMES, local)]
    for variant in camera.variants():
        first = camera.download(variant.uri, into / "first", first_segment_only=True)
        if isinstance(first, Path):  # else the playlists check reports it
            requests.append(DecodeRequest(name, variant.uri, PROBE, first, variant))
    return requests


def decode_problems(
    cameras: Mapping[str, tuple[StoredCamera, Sequence[SourceFacts]]], workdir: Path
) -> dict[str, list[str]]:
    """Per camera: the baseline decodes end to end to the sources' frames (± one per source) and
    each variant's first segment decodes at the size the master claims.

    The cameras download side by side, then one PyAV child decodes them all, side by side too.
    """
    problems: dict[str, list[str]] = {name: [] for name in cameras}
    with ThreadPoolExecutor(max_workers=max(1, len(cameras))) as pool:
        downloads = [
            pool.submit(download_for_decoding, name, camera, workdir / f"{index:03d}")
            for index, (name, (camera, _)) in enumerate(cameras.items())
        ]
    requests: list[DecodeRequest] = []
    for name, download in zip(cameras, downloads, strict=True):
        found = download.result()
        if isinstance(found, str):
            problems[name].append(found)
        else:
            requests += found
    seconds = sum(s.seconds for _, sources in cameras.values() for s in sources)
    answers = examine(
        [(r.mode, r.local) for r in requests],
        DECODE_DEADLINE_BASE_SECONDS + DECODE_DEADLINE_PER_HLS_SECOND * seconds,
    )
    for request, answer in zip(requests, answers, strict=True):
        camera, sources = cameras[request.camera]
        if isinstance(answer, int):
            problem = frame_count_problem(answer, sources, baseline_fps(sources))
        elif isinstance(answer, VideoProbe) and request.variant is not None:
            problem = size_problem(request.variant.resolution, (answer.width, answer.height))
        else:  # the error names the local copy: the key is named below
            problem = str(answer).replace(f"{request.local}: ", "")
        if problem:
            problems[request.camera].append(f"{camera.prefix}{request.uri}: {problem}")
    return problems
