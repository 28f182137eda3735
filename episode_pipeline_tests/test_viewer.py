"""`episode-pipeline view` in a real browser (Debian's chromium through Playwright): episodes
processed by the real pipeline on the session's stack, the command run as an operator runs it.

One 3-camera sample with its state and action, 6 s at 30 fps, and one whose first camera is a
quarter short (a sync finding at its end). The page is read through `window.viewer`, the page's
own handle on its clock and cameras (`viewer/web/viewer.js`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from episode_pipeline.episodes.keys import EpisodeRef
from episode_pipeline.local.upload import upload_episode
from episode_pipeline.report import episode_reports, format_reports
from episode_pipeline.runner import process_episode
from episode_pipeline.samples.writer import SampleSpec, write_sample
from episode_pipeline_tests.support.browser import chromium_or_skip, screenshots
from episode_pipeline_tests.support.graph import latest_metadata

pytestmark = pytest.mark.integration

FPS = 30
FRAME = 1 / FPS
SYNCED = SampleSpec("v3.0", cameras=3, seconds=6.0, fps=FPS, width=320, height=240)
SHORT = SampleSpec(
    "v2.1", cameras=2, seconds=4.0, fps=FPS, width=160, height=120, short_cameras={0: 0.25}
)
START_SECONDS = 30  # the command: the stack is up, so it only reads timeline.json's HEAD
PAGE_MS = 60_000  # a cold chromium on a busy 2-core machine


def processed(tmp: Path, name: str, spec: SampleSpec) -> EpisodeRef:
    archive = tmp / f"{name}.tar.zst"
    write_sample(archive, spec)
    ref = EpisodeRef("viewer-org", f"{name}-{uuid.uuid4().hex[:8]}")
    upload_episode(archive, ref)
    outcome = process_episode(ref)
    assert outcome, outcome.errors
    return ref


@pytest.fixture(scope="module")
def episodes(stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, EpisodeRef]:
    tmp = tmp_path_factory.mktemp("viewer")
    return {
        name: processed(tmp, name, spec) for name, spec in (("synced", SYNCED), ("short", SHORT))
    }


@contextlib.contextmanager
def viewing(ref: EpisodeRef, *args: str) -> Iterator[str]:
    """`episode-pipeline view ORG/EP --no-browser ARGS`: its first line, the page's address;
    Ctrl-C at the end, after which nothing of it runs and its port is closed."""
    command = [sys.executable, "-m", "episode_pipeline.cli", "view", ref.partition_key]
    process = subprocess.Popen(
        [*command, "--no-browser", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert process.stdout is not None
        # Its first line within START_SECONDS, or a failure that says so (not the suite's timeout).
        printed, _, _ = select.select([process.stdout], [], [], START_SECONDS)
        assert printed, f"`view` printed no address within {START_SECONDS} s"
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, process.stderr and process.stderr.read())
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=START_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    port = int(url.split(":")[2].split("/")[0])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, args=["--autoplay-policy=no-user-gesture-required"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(PAGE_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
    finally:
        context.close()
    assert not errors, errors


def ready(page: Any, url: str) -> dict[str, Any]:
    page.goto(url)
    page.wait_for_selector("body[data-ready=true], body[data-error]")
    assert page.get_attribute("body", "data-error") is None
    return state(page)


def state(page: Any) -> dict[str, Any]:
    return page.evaluate("viewer.state()")


def off_the_clock(snapshot: dict[str, Any]) -> dict[str, float]:
    """Each camera showing a picture: how far its video is from the clock, in seconds."""
    return {
        camera["name"]: abs(camera["time"] - snapshot["t"])
        for camera in snapshot["cameras"]
        if camera["inRange"]
    }


def playing_for(page: Any, seconds: float) -> dict[str, Any]:
    """The state after the clock has run `seconds` (it holds while a camera loads)."""
    start = state(page)["t"]
    page.wait_for_function(f"viewer.state().t >= {start + seconds} && !viewer.state().held")
    return state(page)


def test_every_camera_stays_within_a_frame_of_the_clock_through_play_seek_and_steps(
    episodes: dict[str, EpisodeRef], page: Any
) -> None:
    with viewing(episodes["synced"]) as url:
        first = ready(page, url)
        names = page.eval_on_selector_all("video", "vs => vs.map(v => v.dataset.camera)")
        assert len(names) == 3 and [c["name"] for c in first["cameras"]] == names
        assert first["t"] == 0 and not first["playing"]

        page.keyboard.press("Space")
        after = playing_for(page, 3.0)
        assert after["playing"]
        drift = off_the_clock(after)
        assert len(drift) == 3 and max(drift.values()) <= FRAME, drift
        shot = screenshots() / "viewer.png"
        page.screenshot(path=shot, full_page=True)

        # A seek while playing: a click on the bar at a quarter of the episode.
        box = page.locator("#bar").bounding_box()
        page.mouse.click(box["x"] + box["width"] / 4, box["y"] + box["height"] / 2)
        page.wait_for_function("Math.abs(viewer.state().t - 1.5) < 0.5")
        drift = off_the_clock(playing_for(page, 1.0))
        assert len(drift) == 3 and max(drift.values()) <= FRAME, drift

        # Space pauses; `.` and `,` step one frame, every camera with the clock.
        page.keyboard.press("Space")
        paused = state(page)
        assert not paused["playing"]
        page.keyboard.press(".")
        page.keyboard.press(".")
        page.keyboard.press(",")
        stepped = state(page)
        frames = round(stepped["t"] * FPS)
        assert stepped["t"] == pytest.approx(frames / FPS, abs=1e-6)
        assert frames == round(paused["t"] * FPS) + 1
        page.wait_for_function(
            f"viewer.state().cameras.every(c => Math.abs(c.time - viewer.state().t) <= {FRAME / 2})"
        )
        assert "t=" in page.evaluate("location.search")  # the address follows the seek
    assert shot.stat().st_size > 10_000


def test_a_link_opens_at_its_moment_and_the_address_follows_seeks(
    episodes: dict[str, EpisodeRef], page: Any
) -> None:
    with viewing(episodes["synced"], "--episode-index", "0") as url:
        assert url.endswith("?episode=0")
        opened = ready(page, f"{url}&t=2.5")
        assert opened["t"] == pytest.approx(2.5)
        page.wait_for_function(
            f"viewer.state().cameras.every(c => Math.abs(c.time - 2.5) <= {FRAME / 2})"
        )
        box = page.locator("#bar").bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.75, box["y"] + box["height"] / 2)
        search = page.evaluate("location.search")
        seconds = float(search.split("t=")[1])
        assert seconds == pytest.approx(4.5, abs=0.1) and "episode=0" in search
        assert state(page)["t"] == pytest.approx(seconds, abs=1e-3)


def test_the_plots_hold_every_frame_and_a_joint_can_be_hidden(
    episodes: dict[str, EpisodeRef], page: Any
) -> None:
    with viewing(episodes["synced"]) as url:
        ready(page, url)
        frames = SYNCED.frames_per_episode
        for name in ("state", "action"):
            points = page.evaluate(f"viewer.plots.{name}.data.map(d => d.length)")
            assert points[0] == frames and set(points) == {frames}, (name, points)
        joints = page.evaluate("viewer.plots.state.series.length") - 1
        assert joints >= 2
        # uPlot's legend: a click on a joint's name hides its series.
        page.locator(".u-legend .u-series").nth(1).click()
        assert page.evaluate("viewer.plots.state.series[1].show") is False
        # A click on a plot seeks there.
        over = page.locator(".u-over").first.bounding_box()
        page.mouse.click(over["x"] + over["width"] / 2, over["y"] + over["height"] / 2)
        assert state(page)["t"] == pytest.approx(3.0, abs=0.15)


def test_a_short_camera_s_finding_is_drawn_where_its_picture_ends(
    episodes: dict[str, EpisodeRef], page: Any
) -> None:
    with viewing(episodes["short"]) as url:
        ready(page, url)
        findings = page.evaluate(
            """() => [...document.querySelectorAll('.finding')].map(f => ({
                camera: f.dataset.camera, start: Number(f.dataset.start),
                left: f.getBoundingClientRect().left,
                bar: document.getElementById('bar').getBoundingClientRect()}))"""
        )
        drawn = [f for f in findings if f["camera"]]
        assert drawn and {f["camera"] for f in drawn} == {SHORT.camera_keys[0]}, findings
        finding = min(drawn, key=lambda f: f["start"])
        # A quarter of 4 s missing at the end: the finding starts where the picture ends.
        assert finding["start"] == pytest.approx(3.0, abs=2 * FRAME)
        bar = finding["bar"]
        placed = (finding["left"] - bar["left"]) / bar["width"] * 4.0
        assert placed == pytest.approx(finding["start"], abs=0.05)
        # Past the end of its picture the camera says so; the other still plays.
        page.evaluate("viewer.seek(3.5)")
        page.wait_for_selector("figure.no-picture")
        assert page.locator("figure.no-picture").count() == 1


def test_the_command_serves_only_the_episode_s_outputs(episodes: dict[str, EpisodeRef]) -> None:
    ref = episodes["synced"]
    with viewing(ref) as url:
        base = url.split("?")[0]
        with urllib.request.urlopen(f"{base}outputs/timeline.json", timeout=30) as response:
            assert response.headers["Content-Type"] == "application/json"
        for path in ("outputs/../take.tar.zst", "outputs/%2e%2e/take.tar.zst", "pyproject.toml"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 404, path


def test_an_unprocessed_episode_is_named_with_where_to_look(stack) -> None:
    ref = EpisodeRef("viewer-org", f"never-{uuid.uuid4().hex[:8]}")
    done = subprocess.run(
        [sys.executable, "-m", "episode_pipeline.cli", "view", ref.partition_key, "--no-browser"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and not done.stdout
    assert f"{ref.processed_prefix}timeline.json: missing" in done.stderr
    assert f"episode-pipeline status {ref.partition_key}" in done.stderr


def test_the_episode_asset_and_status_say_how_to_open_it(
    episodes: dict[str, EpisodeRef], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a viewer address (production today) the command; with one (`dev`'s), a link."""
    ref = episodes["synced"]
    command = f"episode-pipeline view {ref.partition_key}"
    assert latest_metadata(ref, "episode")["viewer"] == command
    assert f"look at it: {command}" in format_reports(episode_reports(ref))
    monkeypatch.setenv("VIEWER_URL", "http://127.0.0.1:3001")
    link = f"http://127.0.0.1:3001/e/viewer-org/{ref.episode_id}/"
    assert f"look at it: {link}" in format_reports(episode_reports(ref))
