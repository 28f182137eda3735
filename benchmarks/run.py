"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--stage NAME ...]``.

Prints a table (stage, metric, ours, baseline, ratio, unit) and writes ``latest.json`` and
``latest.md`` to ``--out`` (default ``benchmarks/results``). PostgreSQL comes from an embedded
stack started in a private home under the scratch directory and stopped at the end; the
developer's ``.episode_pipeline/`` is never touched. ``--stack-home`` reuses a stack instead
(left running if it already was), which the smoke test does with the test session's stack.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import (
    batch,
    campaign_ledger,
    end_to_end,
    extraction,
    fleet,
    footprint,
    frames_convert,
    frames_load,
    hls,
    sensor,
    startup,
    viewer,
)
from benchmarks.common import REPO_ROOT, BenchContext, Config, Result, machine_facts
from benchmarks.report import SCHEMA_VERSION, markdown, table

STAGES: dict[str, ModuleType] = {
    startup.NAME: startup,
    footprint.NAME: footprint,
    sensor.NAME: sensor,
    frames_load.NAME: frames_load,
    frames_convert.NAME: frames_convert,
    extraction.NAME: extraction,
    hls.NAME: hls,
    end_to_end.NAME: end_to_end,
    batch.NAME: batch,
    campaign_ledger.NAME: campaign_ledger,
    fleet.NAME: fleet,
    viewer.NAME: viewer,
}
# Stages `make bench` leaves out (their minutes would break its ten): run with `--stage NAME`.
# `fleet` alone (a 10,000-episode fleet, the UI's pages, the daemon part's burst) took longer than
# ten minutes (benchmarks/README.md): `make bench-fleet`.
ON_REQUEST = (batch.NAME, campaign_ledger.NAME, fleet.NAME, viewer.NAME)
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"


class _Stack:
    """Starts the embedded stack on first use; `close()` stops it if this run started it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._info: Any = None
        self._resource: Any = None
        self._started_here = False

    def info(self) -> Any:
        if self._info is None:
            from episode_pipeline.local.stack import stack_status, start_stack

            self._started_here = not stack_status(self.home).running
            self._info = start_stack(self.home)
        return self._info

    def database(self) -> Any:
        if self._resource is None:
            from episode_pipeline.config.settings import DatabaseSettings
            from episode_pipeline.defs.resources.database import PostgresResource

            env = self.info().env
            self._resource = PostgresResource.from_settings(DatabaseSettings.from_env(env))
        return self._resource

    def close(self) -> None:
        if self._started_here:
            from episode_pipeline.local.stack import stop_stack

            stop_stack(self.home, save_objects=False)
            self._started_here = False


def run(
    stages: list[str],
    config: Config,
    out_dir: Path,
    *,
    stack_home: Path | None = None,
    keep_workdir: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run `stages`, write latest.json / latest.md into `out_dir`, return the report."""
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="episode-bench-"))
    stack = _Stack(stack_home or workdir / "stack-home")
    ctx = BenchContext(config=config, workdir=workdir, stack=stack.info, database=stack.database)
    results: list[Result] = []
    statuses: dict[str, dict[str, Any]] = {}
    loads: list[float] = []  # 1-minute load average at each stage's start and end
    try:
        for name in stages:
            log(f"[bench] {name} ... (load average {os.getloadavg()[0]:.2f})")
            loads.append(os.getloadavg()[0])
            stage_started = time.perf_counter()
            ctx.phases = {}
            try:
                results += STAGES[name].run(ctx)
                statuses[name] = {"status": "ok"}
            except Exception as error:
                traceback.print_exc()
                statuses[name] = {"status": "error", "error": f"{type(error).__name__}: {error}"}
            statuses[name]["seconds"] = round(time.perf_counter() - stage_started, 2)
            if ctx.phases:
                statuses[name]["phases_s"] = ctx.phases
                log(f"[bench] {name}: {statuses[name]['seconds']:.0f} s, of which {ctx.phases}")
            loads.append(os.getloadavg()[0])
            statuses[name]["load_average"] = [round(loads[-2], 2), round(loads[-1], 2)]
        ctx.facts["load"] = f"{min(loads):.1f}..{max(loads):.1f}" if loads else "-"
    finally:
        stack.close()
        if keep_workdir:
            log(f"[bench] scratch kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "total_seconds": round(time.perf_counter() - started, 1),
        "config": {k: v for k, v in vars(config).items()},
        "machine": machine_facts(),
        "facts": ctx.facts,
        "stages": statuses,
        "results": [r.as_dict() for r in results],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "latest.md").write_text(markdown(report))
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test, < 30 s)")
    parser.add_argument(
        "--stage", action="append", choices=sorted(STAGES), help="run only this stage (repeatable)"
    )
    parser.add_argument("--repeats", type=int, help="timed repeats per side (median reported)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SIZE=N",
        help="override one size of `benchmarks.common.Config` (e.g. big_archive_mb=0)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where latest.* go")
    parser.add_argument("--stack-home", type=Path, help="use (or start) the stack in this home")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the scratch directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config.quick_config() if args.quick else Config()
    overrides: dict[str, Any] = {"repeats": args.repeats} if args.repeats else {}
    for item in args.set:
        name, _, value = item.partition("=")
        default = getattr(config, name, None)
        if default is None or isinstance(default, bool) or not value:
            raise SystemExit(f"--set {item}: no such size (see benchmarks/common.py Config)")
        overrides[name] = type(default)(value)
    config = replace(config, **overrides)
    stages = args.stage or [name for name in STAGES if name not in ON_REQUEST]
    report = run(
        stages, config, args.out, stack_home=args.stack_home, keep_workdir=args.keep_workdir
    )
    print()
    print(table(report["results"]))
    print(f"\nwritten: {args.out / 'latest.json'}, {args.out / 'latest.md'}")
    return 0 if all(s["status"] == "ok" for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
