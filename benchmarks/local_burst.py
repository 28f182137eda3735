"""The local `dev`'s burst: 1,000 uploads until their runs exist, pooled storages against unpooled.

`python -m benchmarks.local_burst UPLOADS CAP_SECONDS OUTDIR`. One local stack of its own; its
dagster.yaml is the one `stack up` writes (`local/dagster_home.py`: the local sensors block, one
tick after another, the local run coordinator), with the run queue held (`max_concurrent_runs:
0`: a run *exists* once the daemon has created and queued it, nothing is launched). For each side
in turn (pooled = the local instance as it is now and production's storages; unpooled =
dagster-postgres's own, the local instance before issue 27) the same `dagster-daemon run` that
`dev` starts is given UPLOADS synthetic S3 events on the stack's queue at once, and the runs its
uploads sensor creates are counted until all exist or CAP_SECONDS pass (the unpooled side is
slow: capped, its rate is the figure). Writes OUTDIR/latest.json and OUTDIR/latest.md.

`dev` itself also executes runs (two at a time) beside the daemon; holding the queue measures the
daemon's hand-off alone, on the same loaded machine for both sides.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks import end_to_end, sensor
from benchmarks.fleet_daemon import sensor_ticks, staged_uploads

POLL_SECONDS = 1.0


def local_config(dagster_home: str, *, pooled: bool) -> str:
    """The local instance's dagster.yaml with the run queue held and the storages chosen;
    returns the text to restore."""
    from episode_pipeline.local.dagster_home import storage_config

    path = Path(dagster_home) / "dagster.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    config["run_coordinator"]["config"]["max_concurrent_runs"] = 0
    config.update(storage_config(config["run_storage"]["config"], pooled=pooled))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return original


def burst(info: Any, side: str, uploads: int, cap_seconds: float, workdir: Path) -> dict[str, Any]:
    from dagster import DagsterInstance, RunsFilter

    from episode_pipeline.config.settings import AwsSettings, QueueSettings
    from episode_pipeline.defs.sensors.sqs import UPLOADS_SENSOR_NAME
    from episode_pipeline.uploads.upload_queue import UploadQueue

    home = info.env["DAGSTER_HOME"]
    queue = UploadQueue(
        info.sqs_queue_url,
        AwsSettings.from_env(info.env),
        QueueSettings().visibility_timeout_seconds,
    )
    log = workdir / f"daemon-{side}.log"
    counts: list[tuple[float, int]] = []
    with staged_uploads(info, f"local-{side}", uploads) as objects:
        original = local_config(home, pooled=side == "pooled")
        try:
            with (
                end_to_end.daemon(info, log) as process,
                DagsterInstance.from_config(home) as instance,
            ):
                end_to_end.wait_for_daemon(instance, process, log)
                since = time.time()
                filters = RunsFilter(
                    tags={"dagster/sensor_name": UPLOADS_SENSOR_NAME},
                    created_after=datetime.fromtimestamp(since, UTC),
                )
                sensor.send_events(queue, *objects)
                existing = 0
                while existing < uploads and time.time() - since < cap_seconds:
                    time.sleep(POLL_SECONDS)
                    existing = instance.get_runs_count(filters)
                    counts.append((round(time.time() - since, 1), existing))
                seconds = time.time() - since
                ticks = [t for t in sensor_ticks(instance, UPLOADS_SENSOR_NAME, since) if t.run_ids]
                run_ids = [r.run_id for r in instance.get_runs(filters)]
                sensor.in_parallel(instance.delete_run, run_ids)
        finally:
            (Path(home) / "dagster.yaml").write_text(original)
    minute = next((n for t, n in counts if t >= 60), None)
    return {
        "uploads": uploads,
        "runs_existing": existing,
        "all_exist": existing >= uploads,
        "seconds": round(seconds, 1),
        "runs_per_minute": round(existing / seconds * 60, 1),
        "runs_in_the_first_minute": minute,
        "uploads_ticks_with_runs": len(ticks),
        "runs_per_tick_median": sorted(len(t.run_ids) for t in ticks)[len(ticks) // 2]
        if ticks
        else None,
        "counts_every_30_s": [c for c in counts if int(c[0]) % 30 == 0][:40],
    }


def _main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    from episode_pipeline.local.stack import start_stack, stop_stack

    uploads, cap_seconds, outdir = int(argv[0]), float(argv[1]), Path(argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"local-burst-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = start_stack(workdir / "stack-home")
    results: dict[str, Any] = {}
    loads: dict[str, list[float]] = {}
    try:
        for side in ("pooled", "unpooled"):
            before = os.getloadavg()[0]
            results[side] = burst(info, side, uploads, cap_seconds, workdir)
            loads[side] = [round(before, 1), round(os.getloadavg()[0], 1)]
    finally:
        stop_stack(workdir / "stack-home", save_objects=False)
    pooled, unpooled = results["pooled"], results["unpooled"]
    ratio = pooled["runs_per_minute"] / unpooled["runs_per_minute"]
    report = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_seconds": round(time.time() - started),
        "load_average_before_after": loads,
        "cpus": os.cpu_count(),
        "pooled_vs_unpooled_runs_per_minute": round(ratio, 2),
        **results,
    }
    (outdir / "latest.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "# Local `dev` burst: uploads until their runs exist (benchmarks/local_burst.py)",
        "",
        f"Generated {report['generated']}, {report['wall_seconds']} s, {os.cpu_count()} cores, "
        f"load average before/after each side {loads}. Run queue held; each side capped at "
        f"{cap_seconds:g} s.",
        "",
        "| storages | uploads | runs existing | seconds | runs/min | first minute |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {side} | {r['uploads']} | {r['runs_existing']} | {r['seconds']} | "
            f"{r['runs_per_minute']} | {r['runs_in_the_first_minute']} |"
            for side, r in results.items()
        ),
        "",
        f"Pooled vs unpooled: {ratio:.2f}x the runs per minute, same run, same machine.",
    ]
    (outdir / "latest.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
