"""What the HLS checks conclude about one episode, one verdict per camera, without Dagster.

The checks read what S3 holds now (playlists, segments, decoded frames); the sources' facts
(size, rate, duration, frames) come from the probes the transcode recorded (`sources`), since
probing them again would download every mp4 a second time. The rules are `video/stored.py`'s;
`defs/checks/hls.py` shows each verdict as a check result.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episode_pipeline.episodes.extracted_files import (
    ExtractedFiles,
    ProcessedFile,
    videos_by_camera,
)
from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.storage.bucket import Bucket
from episode_pipeline.video.stored import (
    StoredCamera,
    decode_problems,
    drift_problems,
    playlist_problems,
)
from episode_pipeline.video.verify import SourceFacts


def usable_sources(rows: list[dict[str, Any]]) -> list[SourceFacts]:
    fields = ("key", "width", "height", "fps", "frames", "seconds")
    return [SourceFacts(**{f: row[f] for f in fields}) for row in rows if not row.get("error")]


@dataclass(frozen=True)
class CameraVerdicts:
    """One check's verdict on each camera: `camera | passed | problems` rows, the problems
    naming the object."""

    rows: list[dict[str, Any]]

    @property
    def failing(self) -> list[str]:
        return [row["camera"] for row in self.rows if not row["passed"]]

    @property
    def description(self) -> str | None:
        failing = self.failing
        return f"failing camera(s): {', '.join(failing)}" if failing else None


@dataclass
class CheckedCameras:
    """What every HLS check starts from: the episode's cameras as S3 holds them now, and each
    camera's usable sources as the transcode probed them."""

    stored: dict[str, StoredCamera]
    sources: dict[str, list[SourceFacts]]
    recorded: dict[str, list[dict[str, Any]]]
    files: dict[str, list[ProcessedFile]]

    @classmethod
    def load(
        cls,
        ref: EpisodeRef,
        extracted: ExtractedFiles,
        bucket: Bucket,
        recorded: dict[str, list[dict[str, Any]]],
    ) -> CheckedCameras:
        files = videos_by_camera(extracted)
        return cls(
            stored={c: StoredCamera(bucket, ref.hls_prefix(c)) for c in files},
            sources={c: usable_sources(recorded.get(c, [])) for c in files},
            recorded=recorded,
            files=files,
        )

    def verdicts(self, problems_of: Callable[[str], list[str]]) -> CameraVerdicts:
        """Each camera's problems as one check finds them."""
        rows = []
        for camera in self.stored:
            problems = problems_of(camera)
            rows.append({"camera": camera, "passed": not problems, "problems": "; ".join(problems)})
        return CameraVerdicts(rows)

    def unreadable_sources(self, camera: str) -> list[str]:
        """The camera's mp4s the transcode could not probe, or did not."""
        rows = {row["key"]: row for row in self.recorded.get(camera, [])}
        return [
            rows[f.key]["error"] if f.key in rows else f"{f.key}: not probed (see the asset)"
            for f in self.files[camera]
            if f.key not in rows or rows[f.key].get("error")
        ]

    def playlist_problems(self, camera: str) -> list[str]:
        return playlist_problems(self.stored[camera], self.sources[camera])

    def drift_problems(self, camera: str) -> list[str]:
        return drift_problems(self.stored[camera], self.sources[camera])

    def decode_problems(self) -> dict[str, list[str]]:
        """Every camera's decoding problems, decoded side by side in a scratch folder."""
        cameras = {c: (stored, self.sources[c]) for c, stored in self.stored.items()}
        with tempfile.TemporaryDirectory(prefix="hls-decode-") as tmp:
            return decode_problems(cameras, Path(tmp))
