"""Which camera an mp4 belongs to, from its path inside the dataset.

The camera name is the whole feature key (``observation.images.front``, ``observation.image``,
``image``...), one path component. Where it sits depends on the version (v2.x: the parent folder;
v3.0: two levels above the file), so the path template in ``info.json`` is the authority and the
folder positions are only fallbacks. Members stream in any order, so callers record the mp4 paths
and name their cameras once ``meta/info.json`` has been read.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from episode_pipeline.lerobot.info import DatasetInfo

DEFAULT_CAMERA = "cam_main"

# Used only when info.json is missing or has no video_path (a video dataset always writes one).
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
DEFAULT_VIDEO_PATHS = (V30_VIDEO_PATH, V2_VIDEO_PATH)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class VideoLocation:
    """A camera name plus the numbers the path template captured (episode, chunk, file index)."""

    camera: str
    rule: str  # "template", "feature_component", "grandparent" or "default"
    indices: Mapping[str, int] = field(default_factory=dict)


@lru_cache(maxsize=64)
def compile_path_template(template: str) -> re.Pattern[str] | None:
    """Turn a ``str.format`` path template into a regex; ``None`` if the template is malformed.

    ``{video_key}`` captures one path component; integer fields (``{x:03d}``) capture digits. A
    leading ``(?:.*/)?`` lets the same regex match a path that still has a top-level folder.
    """
    pattern = ["(?:.*/)?"]
    seen: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None
    for literal, name, spec, _conversion in parsed:
        pattern.append(re.escape(literal))
        if name is None:
            continue
        body = r"\d+" if spec and spec.endswith("d") else "[^/]+"
        if not _IDENTIFIER.fullmatch(name):
            pattern.append(f"(?:{body})")
        elif name in seen:
            pattern.append(f"(?P={name})")
        else:
            seen.add(name)
            pattern.append(f"(?P<{name}>{body})")
    try:
        return re.compile("".join(pattern))
    except re.error:
        return None


def _strip_root(path: str, root: str) -> str:
    path = path.strip("/")
    root = root.strip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


def locate_video(path: str, info: DatasetInfo | None = None, *, root: str = "") -> VideoLocation:
    """Camera and template indices for one mp4 path (relative to the dataset root, or give root).

    Order: the info.json ``video_path`` template (captured key must be a video feature when the
    features list any), then a path component equal to a video feature key, then the folder two
    levels above the file, then ``cam_main``.
    """
    relative = _strip_root(path, root)
    cameras = set(info.video_features) if info else set()
    templates = (info.video_path,) if info and info.video_path else DEFAULT_VIDEO_PATHS
    for template in templates:
        regex = compile_path_template(template)
        match = regex.fullmatch(relative) if regex else None
        if not match or "video_key" not in match.groupdict():
            continue
        key = match.group("video_key")
        if key in cameras or not cameras:
            indices = {
                k: int(v) for k, v in match.groupdict().items() if k != "video_key" and v.isdigit()
            }
            return VideoLocation(key, "template", indices)
    folders = relative.split("/")[:-1]
    for component in reversed(folders):
        if component in cameras:
            return VideoLocation(component, "feature_component")
    if len(folders) >= 2:
        return VideoLocation(folders[-2], "grandparent")
    return VideoLocation(DEFAULT_CAMERA, "default")


def camera_for(path: str, info: DatasetInfo | None = None, *, root: str = "") -> str:
    """The camera name of one mp4 (see :func:`locate_video` for the rule)."""
    return locate_video(path, info, root=root).camera
