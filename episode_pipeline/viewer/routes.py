"""What the viewer's server answers, as rules (pure; the server is `viewer/server.py`).

Every page lives under its episode: `/e/<org>/<episode>/`. Below that, three kinds of path: the
page's own files (`web/`), the browser libraries npm installed (`web/node_modules/`, pinned by
`web/package-lock.json`), and `outputs/<key>`, one of the episode's outputs, which the server
reads from S3 with the operator's credentials: the bucket stays private, and only keys below an
episode's `processed/` prefix are reachable (never an upload).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote, unquote, urlencode, urlsplit

from episode_pipeline.episodes.keys import EpisodeRef, InvalidEpisodeKey, parse_partition_key

EPISODES = "/e/"
OUTPUTS = "outputs/"
HTML = "text/html; charset=utf-8"
JAVASCRIPT = "text/javascript; charset=utf-8"
CSS = "text/css; charset=utf-8"

# Path below the episode → (file below web/, content type). Nothing else of web/ is served.
FILES: dict[str, tuple[str, str]] = {
    "": ("index.html", HTML),
    "viewer.js": ("viewer.js", JAVASCRIPT),
    "viewer.css": ("viewer.css", CSS),
    "vendor/hls.min.js": ("node_modules/hls.js/dist/hls.min.js", JAVASCRIPT),
    "vendor/uPlot.iife.min.js": ("node_modules/uplot/dist/uPlot.iife.min.js", JAVASCRIPT),
    "vendor/uPlot.min.css": ("node_modules/uplot/dist/uPlot.min.css", CSS),
}
LIBRARIES = tuple(file for file, _ in FILES.values() if file.startswith("node_modules/"))


class NotServed(ValueError):
    """A path the viewer does not serve; the message says why."""


@dataclass(frozen=True)
class Route:
    """A file below web/ (`file`, `content_type`) or an output's S3 key (`key`)."""

    ref: EpisodeRef
    file: str | None = None
    content_type: str | None = None
    key: str | None = None


def route(path: str) -> Route:
    """The request path (query ignored) → what answers it; raises NotServed."""
    path = urlsplit(path).path
    if not path.startswith(EPISODES):
        raise NotServed(f"{path}: not a page of the viewer (pages are /e/ORG/EP/)")
    org, _, rest = path[len(EPISODES) :].partition("/")
    episode, slash, below = rest.partition("/")
    try:
        ref = parse_partition_key(f"{unquote(org)}/{unquote(episode)}")
    except InvalidEpisodeKey as error:
        raise NotServed(f"{path}: {error}") from None
    if not slash:
        raise NotServed(f"{path}: the page is {episode_path(ref)}")
    if below in FILES:
        file, content_type = FILES[below]
        return Route(ref, file=file, content_type=content_type)
    if below.startswith(OUTPUTS):
        return Route(ref, key=output_key(ref, unquote(below[len(OUTPUTS) :])))
    raise NotServed(f"{path}: not a page of the viewer")


def output_key(ref: EpisodeRef, relative: str) -> str:
    """`relative` (to the episode's `processed/` prefix) as the object's key; raises NotServed
    for anything that could leave the prefix."""
    parts = PurePosixPath(relative).parts
    if not relative or relative.startswith("/") or "\\" in relative or ".." in parts:
        raise NotServed(f"{relative!r}: not an output of {ref.partition_key}")
    return ref.processed_prefix + relative


def episode_path(ref: EpisodeRef) -> str:
    return f"{EPISODES}{quote(ref.org_id, safe='')}/{quote(ref.episode_id, safe='')}/"


def viewer_url(
    base: str, ref: EpisodeRef, episode_index: int | None = None, seconds: float | None = None
) -> str:
    """The episode's page below `base` (`http://host:port`): `?episode=N` picks a LeRobot
    episode of the upload, `t` a moment."""
    query = {}
    if episode_index is not None:
        query["episode"] = str(episode_index)
    if seconds is not None:
        query["t"] = f"{seconds:g}"
    return base.rstrip("/") + episode_path(ref) + (f"?{urlencode(query)}" if query else "")


def view_command(ref: EpisodeRef) -> str:
    return f"episode-pipeline view {ref.partition_key}"


def how_to_view(ref: EpisodeRef, viewer_base: str | None) -> str:
    """Where an operator looks at the episode: its page where a viewer serves every episode
    (`VIEWER_URL`: `episode-pipeline dev` runs one), else the command that serves it."""
    return viewer_url(viewer_base, ref) if viewer_base else view_command(ref)
