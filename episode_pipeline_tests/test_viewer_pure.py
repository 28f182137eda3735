"""The viewer's routes: what its server answers, and that nothing outside the episode leaks."""

from __future__ import annotations

import pytest

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.viewer.routes import (
    CSS,
    HTML,
    LIBRARIES,
    NotServed,
    output_key,
    route,
    viewer_url,
)
from episode_pipeline.viewer.server import WEB, missing_libraries

REF = EpisodeRef("acme", "ep-42")


def test_the_page_and_its_libraries_are_files_of_web() -> None:
    page = route("/e/acme/ep-42/?episode=1&t=2.5")
    assert (page.ref, page.file, page.content_type) == (REF, "index.html", HTML)
    assert route("/e/acme/ep-42/vendor/uPlot.min.css").content_type == CSS
    assert set(LIBRARIES) == {
        "node_modules/hls.js/dist/hls.min.js",
        "node_modules/uplot/dist/uPlot.iife.min.js",
        "node_modules/uplot/dist/uPlot.min.css",
    }
    for page in ("index.html", "viewer.js", "viewer.css", "package.json", "package-lock.json"):
        assert (WEB / page).is_file(), page


def test_an_output_is_a_key_below_the_episode_s_processed_prefix() -> None:
    prefix = REF.processed_prefix
    found = route("/e/acme/ep-42/outputs/hls/observation.images.front/master.m3u8")
    assert found.key == f"{prefix}hls/observation.images.front/master.m3u8"
    assert prefix == "orgs/acme/episodes/ep-42/processed/"
    assert route("/e/acme/ep-42/outputs/timeline.json").key == f"{prefix}timeline.json"
    assert route("/e/acme/ep-42/outputs/hls/a%20b/s.ts").key == f"{prefix}hls/a b/s.ts"


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/e/acme/ep-42",  # the page is the folder
        "/e/acme/ep-42/outputs/",
        "/e/acme/ep-42/outputs/../take.tar.zst",
        "/e/acme/ep-42/outputs/hls/../../take.tar.zst",
        "/e/acme/ep-42/outputs/%2e%2e/take.tar.zst",
        "/e/acme/ep-42/outputs//etc/passwd",
        "/e/acme/ep-42/outputs/hls\\..\\take.tar.zst",
        "/e/acme/ep-42/node_modules/hls.js/package.json",
        "/e/acme/ep-42/index.html",
        "/e/acme/%2e%2e/outputs/timeline.json",
        "/e/acme/a%2Fb/outputs/timeline.json",
        "/e/../pyproject.toml",
    ],
)
def test_nothing_else_is_served(path: str) -> None:
    with pytest.raises(NotServed):
        route(path)


def test_output_key_names_the_episode_it_refuses_to_leave() -> None:
    with pytest.raises(NotServed, match="not an output of acme/ep-42"):
        output_key(REF, "../raw")


def test_the_address_carries_the_episode_and_the_moment() -> None:
    base = "http://127.0.0.1:8123"
    assert viewer_url(base, REF) == f"{base}/e/acme/ep-42/"
    assert viewer_url(base + "/", REF, 2) == f"{base}/e/acme/ep-42/?episode=2"
    assert viewer_url(base, REF, 0, 6.41) == f"{base}/e/acme/ep-42/?episode=0&t=6.41"


def test_missing_libraries_names_what_npm_ci_installs(tmp_path) -> None:
    assert missing_libraries(tmp_path) == list(LIBRARIES)
