"""Tolerant reader for a LeRobot ``meta/info.json``.

Real datasets carry stale totals, unknown keys and several spellings of the video info block, so
missing fields become ``None`` and only values of the wrong kind are errors (naming file and field).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CAMERA_DTYPES = ("video", "image")


class DatasetInfoError(ValueError):
    """``meta/info.json`` cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class VideoFeature:
    """A camera feature (dtype ``video``) and what its info block claims about the stream.

    The claims are written by the recording tool, not checked: probe the real stream.
    """

    key: str
    dtype: str
    shape: tuple[int, ...] | None = None
    fps: float | None = None
    height: int | None = None
    width: int | None = None
    codec: str | None = None
    pix_fmt: str | None = None
    has_audio: bool | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetInfo:
    """The parts of ``meta/info.json`` the pipeline uses, plus the raw mapping for the rest."""

    source: str
    codebase_version: str | None = None
    robot_type: str | None = None
    fps: float | None = None
    total_frames: int | None = None
    total_episodes: int | None = None
    total_tasks: int | None = None
    chunks_size: int | None = None
    data_path: str | None = None
    video_path: str | None = None
    features: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    video_features: Mapping[str, VideoFeature] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def camera_keys(self) -> tuple[str, ...]:
        """Feature keys of the cameras (dtype ``video``, or ``image`` when no video exists)."""
        return tuple(self.video_features)

    @property
    def duration_seconds(self) -> int | None:
        """``total_frames / fps`` rounded half-up (as the original worker's Math.round did)."""
        if self.total_frames is None or not self.fps:
            return None
        return math.floor(self.total_frames / self.fps + 0.5)


def _error(source: str, field_name: str, problem: str) -> DatasetInfoError:
    return DatasetInfoError(f"{source}: field {field_name!r} {problem}")


def _opt_str(raw: Mapping[str, Any], key: str, source: str, prefix: str = "") -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise _error(source, prefix + key, f"must be a string, got {type(value).__name__}")


def _opt_number(
    raw: Mapping[str, Any], key: str, source: str, prefix: str = "", *, positive: bool = False
) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise _error(source, prefix + key, "must be a number, got a boolean")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _error(source, prefix + key, f"must be a number, got {value!r}") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise _error(source, prefix + key, f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise _error(source, prefix + key, f"must be positive, got {value!r}")
    return float(value)


def _opt_int(
    raw: Mapping[str, Any], key: str, source: str, prefix: str = "", *, positive: bool = False
) -> int | None:
    number = _opt_number(raw, key, source, prefix)
    if number is None:
        return None
    if number != int(number):
        raise _error(source, prefix + key, f"must be an integer, got {raw.get(key)!r}")
    if number < 0 or (positive and number == 0):
        raise _error(source, prefix + key, f"must not be negative, got {raw.get(key)!r}")
    return int(number)


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list | tuple) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in value
    ):
        return tuple(value)
    return None


def _video_feature(key: str, spec: Mapping[str, Any], source: str) -> VideoFeature:
    prefix = f"features.{key}."
    block_name = "info" if isinstance(spec.get("info"), Mapping) else "video_info"
    block = spec.get(block_name)
    if block is not None and not isinstance(block, Mapping):
        raise _error(source, prefix + block_name, "must be an object")
    block = block or {}
    p = prefix + block_name + "."

    def first(*keys: str) -> str:
        return next((k for k in keys if block.get(k) is not None), keys[0])

    has_audio = block.get("has_audio", block.get("audio"))
    return VideoFeature(
        key=key,
        dtype=str(spec.get("dtype")),
        shape=_shape(spec.get("shape")),
        fps=_opt_number(block, first("video.fps", "fps"), source, p),
        height=_opt_int(block, first("video.height", "height"), source, p),
        width=_opt_int(block, first("video.width", "width"), source, p),
        codec=_opt_str(block, first("video.codec", "codec"), source, p),
        pix_fmt=_opt_str(block, first("video.pix_fmt", "pix_fmt"), source, p),
        has_audio=has_audio if isinstance(has_audio, bool) else None,
        info=dict(block),
    )


def parse_info(
    data: bytes | str | Mapping[str, Any], *, source: str = "meta/info.json"
) -> DatasetInfo:
    """Parse info.json bytes (or an already decoded mapping) into a :class:`DatasetInfo`."""
    if isinstance(data, Mapping):
        raw: Any = data
    else:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetInfoError(f"{source}: not valid JSON: {error}") from error
    if not isinstance(raw, Mapping):
        raise DatasetInfoError(f"{source}: top level must be a JSON object")

    features_raw = raw.get("features")
    if features_raw is None:
        features_raw = {}
    if not isinstance(features_raw, Mapping):
        raise _error(source, "features", "must be an object of feature specs")
    features: dict[str, Mapping[str, Any]] = {}
    for key, spec in features_raw.items():
        if not isinstance(spec, Mapping):
            raise _error(source, f"features.{key}", "must be an object")
        features[str(key)] = spec
    videos = {
        k: _video_feature(k, s, source) for k, s in features.items() if s.get("dtype") == "video"
    }
    if not videos:
        videos = {
            k: _video_feature(k, s, source)
            for k, s in features.items()
            if s.get("dtype") in CAMERA_DTYPES
        }

    return DatasetInfo(
        source=source,
        codebase_version=_opt_str(raw, "codebase_version", source),
        robot_type=_opt_str(raw, "robot_type", source),
        fps=_opt_number(raw, "fps", source, positive=True),
        total_frames=_opt_int(raw, "total_frames", source),
        total_episodes=_opt_int(raw, "total_episodes", source),
        total_tasks=_opt_int(raw, "total_tasks", source),
        chunks_size=_opt_int(raw, "chunks_size", source, positive=True),
        data_path=_opt_str(raw, "data_path", source),
        video_path=_opt_str(raw, "video_path", source),
        features=features,
        video_features=videos,
        raw=dict(raw),
    )
