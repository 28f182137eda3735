"""Stage `viewer`: how long `episode-pipeline view`'s page takes to be ready (issue 35).

- **page_ready** — seconds from navigation to the page's own ready mark (`body[data-ready]`,
  `viewer.readyAt`): timeline.json read, the state and action plotted, and every camera's first
  frame decoded. Debian's chromium through Playwright, a fresh browser context each time
  (nothing cached), the viewer's server (`viewer/server.py`) reading the local stack's S3.
  Ours: a 10-minute episode of 3 cameras at 640x480 (`--quick`: 1 minute), processed by
  `episode-pipeline process`. Baseline: the same page for a 6-second episode of the same
  cameras, so the ratio says how much of the wait grows with the episode's length (the
  timeline's series are bounded by min/max decimation; the playlists are not). Target: ours
  within 2 s, an absolute one.

Both pages are loaded alternately (A B A B ...); medians are reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import BenchContext, Result, seconds_result
from episode_pipeline.episodes.keys import EpisodeRef

NAME = "viewer"
TARGET_SECONDS = 2.0
CAMERAS, WIDTH, HEIGHT = 3, 640, 480
BASELINE_SECONDS = 6.0
PROCESS_TIMEOUT_SECONDS = 3600  # a 10-minute 3-camera episode on 2 shared cores
PAGE_TIMEOUT_MS = 120_000


def processed_episode(ctx: BenchContext, name: str, seconds: float) -> EpisodeRef:
    """A sample of `seconds` uploaded and processed as an operator would (`process`)."""
    from episode_pipeline.config.settings import Settings
    from episode_pipeline.local.upload import upload_episode
    from episode_pipeline.samples.writer import SampleSpec, write_sample

    stack = ctx.stack()
    archive = ctx.workdir / NAME / f"{name}.tar.zst"
    archive.parent.mkdir(parents=True, exist_ok=True)
    spec = SampleSpec("v3.0", cameras=CAMERAS, seconds=seconds, width=WIDTH, height=HEIGHT)
    write_sample(archive, spec)
    ref = EpisodeRef("bench-viewer", f"{name}-{uuid.uuid4().hex[:8]}")
    upload_episode(archive, ref, Settings.from_env(stack.env))
    cli = str(Path(sys.executable).parent / "episode-pipeline")
    env = {**os.environ, "EPISODE_PIPELINE_HOME": stack.home}
    done = subprocess.run(
        [cli, "process", ref.partition_key], env=env, capture_output=True, text=True,
        timeout=PROCESS_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{NAME}: process {ref} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return ref


def page_ready_seconds(browser: Any, url: str) -> float:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("body[data-ready=true], body[data-error]", timeout=PAGE_TIMEOUT_MS)
        error = page.get_attribute("body", "data-error")
        if error:
            raise RuntimeError(f"{NAME}: {url}: {error}")
        return float(page.evaluate("viewer.readyAt")) / 1000
    finally:
        context.close()


def run(ctx: BenchContext) -> list[Result]:
    from playwright.sync_api import sync_playwright

    from episode_pipeline.config.settings import Settings
    from episode_pipeline.storage.bucket import Bucket
    from episode_pipeline.viewer.routes import viewer_url
    from episode_pipeline.viewer.server import ViewerServer

    seconds = 60.0 if ctx.config.quick else 600.0
    with ctx.phase("set-up: samples, process"):
        long = processed_episode(ctx, "long", seconds)
        short = processed_episode(ctx, "short", BASELINE_SECONDS)
    settings = Settings.from_env(ctx.stack().env)
    server = ViewerServer(Bucket(settings.bucket, settings.aws))
    server.start()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    ours: list[float] = []
    base: list[float] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium)
            try:
                page_ready_seconds(browser, viewer_url(server.base_url, short))  # warm chromium
                for _ in range(ctx.config.repeats):
                    with ctx.phase("ours"):
                        ours.append(page_ready_seconds(browser, viewer_url(server.base_url, long)))
                    with ctx.phase("baseline"):
                        base.append(page_ready_seconds(browser, viewer_url(server.base_url, short)))
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    result = seconds_result(
        NAME,
        "page_ready",
        ours,
        base,
        baseline_name=f"the same page for a {BASELINE_SECONDS:g} s episode",
        details={"episode": f"{CAMERAS} cameras {WIDTH}x{HEIGHT}, {seconds:g} s, 30 fps, v3.0"},
    )
    result.target = f"ours within {TARGET_SECONDS:g} s"
    result.met = result.ours <= TARGET_SECONDS
    return [result]
