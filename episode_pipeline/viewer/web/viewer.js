// The episode viewer: every camera held to one clock, the state and action plotted under it.
// Reads outputs/timeline.json (docs/contract.md#timeline) through `episode-pipeline view`.
"use strict";

(() => {
  const OUTPUTS = "outputs/";
  const TIMELINE = { format: "episode_pipeline/timeline", version: 1 };
  const SEEK_DRIFT = 0.25; // seconds: beyond it a camera is seeked, below it caught up by its rate
  const CATCH_UP_SECONDS = 0.5; // a drift is caught up over about this long
  const MAX_NUDGE = 0.1; // at most ±10 % of the clock's rate while catching up
  const COLORS = ["#4fa3ff", "#ffb44f", "#6bd66b", "#ff6b9d", "#b48cff", "#4fd6d6", "#d6d64f",
    "#ff8c4f", "#8cb4ff", "#c8c8c8"];

  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);

  // One clock for every camera: seconds on the episode's rows' `timestamp` axis. It runs on
  // the wall clock while playing, and holds while a camera it needs has no data yet.
  class Clock {
    constructor(t) {
      this.anchorT = t;
      this.anchorWall = performance.now();
      this.rate = 1;
      this.playing = false;
      this.held = false;
    }
    now() {
      if (!this.playing || this.held) return this.anchorT;
      return this.anchorT + ((performance.now() - this.anchorWall) / 1000) * this.rate;
    }
    rebase(t) {
      this.anchorT = t;
      this.anchorWall = performance.now();
    }
    play() { this.rebase(this.now()); this.playing = true; }
    pause() { this.rebase(this.now()); this.playing = false; }
    seek(t) { this.rebase(t); }
    setRate(rate) { this.rebase(this.now()); this.rate = rate; }
    hold(waiting) {
      if (waiting === this.held) return;
      this.rebase(this.now());
      this.held = waiting;
    }
  }

  function fail(message) {
    document.body.dataset.error = message;
    $("status").textContent = message;
    console.error(message);
  }

  async function loadTimeline() {
    const response = await fetch(OUTPUTS + "timeline.json");
    if (!response.ok) throw new Error(`timeline.json: HTTP ${response.status}: ${await response.text()}`);
    const timeline = await response.json();
    if (timeline.format !== TIMELINE.format || timeline.version !== TIMELINE.version) {
      throw new Error(`timeline.json: ${timeline.format} version ${timeline.version}; this viewer reads ${TIMELINE.format} version ${TIMELINE.version}`);
    }
    return timeline;
  }

  // "00:01:02.500" -> 62.5
  const vttSeconds = (text) => text.split(":").reduce((total, part) => total * 60 + parseFloat(part), 0);

  async function loadStoryboard(board) {
    const url = new URL(OUTPUTS + board.vtt, location.href);
    const response = await fetch(url);
    if (!response.ok) return [];
    const cues = [];
    for (const block of (await response.text()).split(/\r?\n\r?\n/)) {
      const lines = block.trim().split(/\r?\n/);
      const timing = lines.findIndex((line) => line.includes("-->"));
      if (timing < 0 || !lines[timing + 1]) continue;
      const [start, end] = lines[timing].split("-->").map((s) => vttSeconds(s.trim()));
      const [image, fragment] = lines[timing + 1].trim().split("#xywh=");
      const [x, y, w, h] = fragment.split(",").map(Number);
      cues.push({ start, end, image: new URL(image, url).href, x, y, w, h });
    }
    return cues;
  }

  function attachVideo(video, url, start) {
    if (window.Hls && Hls.isSupported()) {
      const hls = new Hls({ startPosition: start, enableWorker: true });
      hls.on(Hls.Events.ERROR, (_, data) => {
        if (data.fatal) fail(`${video.dataset.camera}: ${data.type}: ${data.details}`);
      });
      hls.loadSource(url);
      hls.attachMedia(video);
      return hls;
    }
    video.src = url; // a browser that plays HLS itself
    video.addEventListener("loadedmetadata", () => { video.currentTime = start; }, { once: true });
    return null;
  }

  function main(timeline) {
    const episodes = timeline.episodes;
    if (!episodes.length) throw new Error("timeline.json lists no episode");
    const wanted = params.has("episode") ? Number(params.get("episode")) : episodes[0].index;
    const episode = episodes.find((e) => e.index === wanted);
    if (!episode) throw new Error(`no LeRobot episode ${wanted} in ${timeline.episode} (it has ${episodes.map((e) => e.index).join(", ")})`);
    const fps = timeline.fps || 30;
    const frame = 1 / fps;
    const span = Math.max(episode.end - episode.start, frame);
    const clamp = (t) => Math.min(Math.max(t, episode.start), episode.end - frame / 2);
    const clock = new Clock(clamp(params.has("t") ? Number(params.get("t")) : episode.start));

    document.title = `${timeline.episode} · episode ${episode.index}`;
    $("title").textContent = timeline.episode;
    const select = $("episode");
    for (const e of episodes) select.add(new Option(`${e.index} (${e.frames} frames)`, e.index, false, e === episode));
    select.addEventListener("change", () => { location.search = `?episode=${select.value}`; });

    // Cameras: one <video> each, at `offset + t` of its stream within [start, end).
    const cameras = [];
    const firstFrames = [];
    for (const track of timeline.cameras) {
      const figure = document.createElement("figure");
      const video = document.createElement("video");
      video.dataset.camera = track.name;
      video.muted = true;
      video.playsInline = true;
      video.preload = "auto";
      if (track.poster) video.poster = OUTPUTS + track.poster;
      const caption = document.createElement("figcaption");
      caption.textContent = track.name;
      figure.append(video, caption);
      $("cameras").append(figure);
      const range = episode.cameras[track.name] || { error: "not in this episode" };
      const playlist = track.master || track.playlist;
      if (track.error || range.error || !playlist) {
        const why = document.createElement("div");
        why.className = "error";
        why.textContent = track.error || range.error || "no playlist";
        figure.append(why);
        continue;
      }
      const camera = { name: track.name, video, figure, offset: range.offset, start: range.start, end: range.end, cues: [] };
      camera.hls = attachVideo(video, OUTPUTS + playlist, Math.max(0, camera.offset + clock.now()));
      firstFrames.push(new Promise((resolve) => {
        if (video.readyState >= 2) resolve();
        else video.addEventListener("loadeddata", resolve, { once: true });
      }));
      if (track.storyboard) loadStoryboard(track.storyboard).then((cues) => { camera.cues = cues; });
      cameras.push(camera);
    }

    // The timeline bar: the episode from its first row to one frame after its last.
    const bar = $("bar");
    const at = (t) => `${((t - episode.start) / span) * 100}%`;
    const timeAt = (clientX) => {
      const box = bar.getBoundingClientRect();
      return episode.start + ((clientX - box.left) / box.width) * span;
    };
    for (const [edge, t] of [["start", episode.start], ["end", episode.end]]) {
      const mark = document.createElement("div");
      mark.className = `boundary ${edge}`;
      mark.style.left = at(t);
      mark.innerHTML = `<span>episode ${episode.index} ${edge} ${t.toFixed(3)} s</span>`;
      bar.append(mark);
    }
    const findings = [...episode.findings, ...timeline.findings.filter((f) => f.start == null)];
    const list = document.createElement("ul");
    for (const finding of findings) {
      const item = document.createElement("li");
      item.textContent = (finding.camera ? `${finding.camera}: ` : "") + finding.message;
      if (finding.start != null) {
        const mark = document.createElement("div");
        mark.className = "finding";
        mark.dataset.camera = finding.camera || "";
        mark.dataset.start = finding.start;
        mark.dataset.end = finding.end;
        mark.title = item.textContent;
        mark.style.left = at(finding.start);
        mark.style.width = `${((finding.end - finding.start) / span) * 100}%`;
        bar.append(mark);
        item.addEventListener("click", () => seek(finding.start));
      }
      list.append(item);
    }
    $("findings").replaceChildren(...(findings.length ? [Object.assign(document.createElement("h2"), { textContent: "sync findings" }), list] : []));
    for (const camera of cameras) {
      const lane = document.createElement("div");
      lane.className = "lane";
      lane.innerHTML = `<label>${camera.name}</label>`;
      const covered = document.createElement("div");
      covered.className = "range";
      const from = Math.max(camera.start - camera.offset, episode.start);
      const to = Math.min(camera.end - camera.offset, episode.end);
      covered.style.left = at(from);
      covered.style.width = `${(Math.max(0, to - from) / span) * 100}%`;
      lane.append(covered);
      $("lanes").append(lane);
    }
    bar.addEventListener("click", (event) => seek(timeAt(event.clientX)));
    const board = $("storyboard");
    bar.addEventListener("mousemove", (event) => {
      const t = timeAt(event.clientX);
      const tiles = [];
      for (const camera of cameras) {
        const cue = camera.cues.find((c) => c.start <= camera.offset + t && camera.offset + t < c.end);
        if (!cue) continue;
        const tile = document.createElement("div");
        tile.className = "tile";
        tile.title = camera.name;
        Object.assign(tile.style, { width: `${cue.w}px`, height: `${cue.h}px`, backgroundImage: `url("${cue.image}")`, backgroundPosition: `-${cue.x}px -${cue.y}px` });
        tiles.push(tile);
      }
      board.replaceChildren(...tiles);
      board.hidden = !tiles.length;
      board.style.left = `${event.clientX - bar.getBoundingClientRect().left}px`;
    });
    bar.addEventListener("mouseleave", () => { board.hidden = true; });

    // The state and action: a series per joint (click its name to hide it), the clock's cursor.
    const plots = {};
    const series = episode.series;
    for (const name of ["state", "action"]) {
      const vectors = series && series[name];
      if (!vectors) continue;
      const holder = document.createElement("div");
      $("plots").append(holder);
      const plot = new uPlot({
        title: `${name} (${series.sampling === "minmax" ? `min/max of ${series.bucket_frames} frames` : "every frame"})`,
        width: Math.max(320, $("plots").clientWidth),
        height: 180,
        scales: { x: { time: false, range: [episode.start, episode.end] } },
        cursor: { drag: { x: false, y: false } },
        series: [{ label: "t (s)" }, ...vectors.names.map((label, i) => ({ label, stroke: COLORS[i % COLORS.length], width: 1 }))],
      }, [series.t, ...vectors.values], holder);
      const cursor = document.createElement("div");
      cursor.className = "plot-cursor";
      plot.over.append(cursor);
      plot.over.addEventListener("click", (event) => seek(plot.posToVal(event.offsetX, "x")));
      plots[name] = { plot, cursor };
    }
    window.addEventListener("resize", () => {
      for (const { plot } of Object.values(plots)) plot.setSize({ width: Math.max(320, $("plots").clientWidth), height: 180 });
    });

    // Controls.
    const share = () => {
      const query = new URLSearchParams({ episode: episode.index, t: clock.now().toFixed(3) });
      history.replaceState(null, "", `?${query}`);
    };
    function seek(t) {
      clock.seek(clamp(t));
      share();
    }
    function toggle() {
      if (clock.playing) { clock.pause(); share(); } else {
        if (clock.now() >= episode.end - frame) clock.seek(episode.start);
        clock.play();
      }
      $("play").textContent = clock.playing ? "Pause" : "Play";
    }
    function step(frames) {
      if (clock.playing) toggle();
      const index = Math.round((clock.now() - episode.start) * fps) + frames;
      seek(episode.start + index / fps);
    }
    $("play").addEventListener("click", toggle);
    $("back").addEventListener("click", () => step(-1));
    $("forward").addEventListener("click", () => step(1));
    $("rate").addEventListener("change", (event) => clock.setRate(Number(event.target.value)));
    document.addEventListener("keydown", (event) => {
      if (event.target.tagName === "SELECT") return;
      if (event.key === " ") { event.preventDefault(); toggle(); }
      else if (event.key === ",") step(-1);
      else if (event.key === ".") step(1);
    });

    // Every animation frame: each camera to the clock, then the cursors.
    function tick() {
      let t = clock.now();
      if (clock.playing && t >= episode.end - frame / 2) {
        clock.seek(clamp(t));
        toggle();
        t = clock.now();
      }
      let waiting = false;
      for (const camera of cameras) {
        const { video } = camera;
        const target = camera.offset + t;
        const inRange = target >= camera.start && target < camera.end;
        camera.figure.classList.toggle("no-picture", !inRange);
        const loading = video.seeking || video.readyState < HTMLMediaElement.HAVE_FUTURE_DATA;
        if (inRange && clock.playing && loading) waiting = true;
        // Paused, or the clock held for a camera still loading: every camera waits at the clock.
        if (!inRange || !clock.playing || clock.held) {
          if (!video.paused) video.pause();
          if (inRange && !video.seeking && Math.abs(video.currentTime - target) > frame / 2) video.currentTime = target;
          continue;
        }
        const drift = video.currentTime - target;
        if (Math.abs(drift) > SEEK_DRIFT) {
          if (!video.seeking) video.currentTime = target;
          waiting = true;
          continue;
        }
        const nudge = Math.min(Math.max(drift / CATCH_UP_SECONDS, -MAX_NUDGE), MAX_NUDGE);
        const rate = clock.rate * (1 - nudge);
        if (Math.abs(video.playbackRate - rate) > 0.002) video.playbackRate = rate;
        if (video.paused) video.play().catch(() => {});
      }
      clock.hold(clock.playing && waiting);
      $("time").textContent = `${t.toFixed(3)} s`;
      $("cursor").style.left = at(t);
      for (const { plot, cursor } of Object.values(plots)) cursor.style.left = `${plot.valToPos(t, "x")}px`;
      requestAnimationFrame(tick);
    }
    requestAnimationFrame(tick);

    // For the browser test and the benchmark: the clock and each camera's time on it.
    window.viewer = {
      clock, episode, fps, cameras, seek,
      plots: Object.fromEntries(Object.entries(plots).map(([name, { plot }]) => [name, plot])),
      state() {
        return {
          t: clock.now(),
          playing: clock.playing,
          held: clock.held,
          cameras: cameras.map((c) => ({
            name: c.name,
            time: c.video.currentTime - c.offset,
            inRange: c.offset + clock.now() >= c.start && c.offset + clock.now() < c.end,
            paused: c.video.paused,
            readyState: c.video.readyState,
          })),
        };
      },
    };
    Promise.all(firstFrames).then(() => {
      window.viewer.readyAt = performance.now();
      document.body.dataset.ready = "true";
      $("status").textContent = `episode ${episode.index}: ${episode.frames} frames, ${cameras.length} camera(s), ${findings.length} finding(s)`;
    });
  }

  loadTimeline().then(main).catch((error) => fail(String(error.message || error)));
})();
