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

from benchmarks import archive_extract, frames_convert, pg_load
from benchmarks.common import REPO_ROOT, BenchContext, Config, Result, machine_facts

STAGES: dict[str, ModuleType] = {
    pg_load.NAME: pg_load,
    frames_convert.NAME: frames_convert,
    archive_extract.NAME: archive_extract,
}
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"
SCHEMA_VERSION = 1


class _Database:
    """Starts the embedded stack on first use; `close()` stops it if this run started it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._resource: Any = None
        self._started_here = False

    def __call__(self) -> Any:
        if self._resource is None:
            from episode_pipeline.defs.resources.database import PostgresResource
            from episode_pipeline.local.stack import stack_status, start_stack
            from episode_pipeline.settings import DatabaseSettings

            self._started_here = not stack_status(self.home).running
            info = start_stack(self.home)
            self._resource = PostgresResource.from_settings(DatabaseSettings.from_env(info.env))
        return self._resource

    def close(self) -> None:
        if self._started_here:
            from episode_pipeline.local.stack import stop_stack

            stop_stack(self.home, save_objects=False)
            self._started_here = False


def _format(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _verdict(row: dict[str, Any]) -> str:
    """`3.10x faster`, `0.98x slower`-style reading of the factor (>1: ours wins)."""
    factor = row["factor"]
    if factor is None:
        return "-"
    speed = row["unit"].endswith("/s")
    if factor >= 1:
        return f"{factor:.2f}x {'faster' if speed else 'less'}"
    return f"{1 / factor:.2f}x {'slower' if speed else 'more'}"


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table for the terminal."""
    header = ("stage", "metric", "ours", "baseline", "ratio", "unit", "verdict")
    lines = [
        (
            r["stage"],
            r["metric"],
            _format(r["ours"]),
            _format(r["baseline"]),
            _format(r["ratio"]),
            r["unit"],
            _verdict(r),
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in [header, *lines]
    )


def markdown(report: dict[str, Any]) -> str:
    """The short summary committed next to latest.json."""
    machine = report["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
    out = [
        "# Benchmark results",
        "",
        f"Generated {report['generated_at']} by `python -m benchmarks.run"
        f"{' --quick' if report['config']['quick'] else ''}` in {report['total_seconds']:.0f} s. "
        "Ratio = ours / baseline, both measured in this run on the same data.",
        "",
        "| stage | metric | ours | baseline | ratio | unit | verdict |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in report["results"]:
        out.append(
            f"| {r['stage']} | {r['metric']} | {_format(r['ours'])} | {_format(r['baseline'])} "
            f"| {_format(r['ratio'])} | {r['unit']} | {_verdict(r)} |"
        )
    failed = {k: v for k, v in report["stages"].items() if v["status"] != "ok"}
    for name, status in failed.items():
        out.append(f"\n**{name} failed:** `{status.get('error', '')}`")
    config = report["config"]
    out += [
        "",
        f"Sizes: {config['rows']:,} frame rows (state/action of {config['state_dim']} floats); "
        f"archive = sample episode ({config['cameras']} cameras, {config['seconds']} s, 640x480 "
        f"H.264) + {config['archive_padding_mb']} MiB incompressible mp4 padding; "
        f"median of {config['repeats']} interleaved repeats.",
        "",
        f"Machine: {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['cpu']}, {machine['memory_gib']} GiB RAM, {machine['platform']}; "
        f"Python {machine['python']}; {packages}; PostgreSQL {report['facts'].get('postgres', '-')}"
        f"; {machine['zstd'] or 'no zstd'}; {machine['tar'] or 'no tar'}; "
        f"commit {(machine['git_commit'] or '-')[:12]}.",
        "",
        "What each stage measures and why its baseline: see `benchmarks/README.md`.",
        "",
    ]
    return "\n".join(out)


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
    database = _Database(stack_home or workdir / "stack-home")
    ctx = BenchContext(config=config, workdir=workdir, database=database)
    results: list[Result] = []
    statuses: dict[str, dict[str, Any]] = {}
    try:
        for name in stages:
            log(f"[bench] {name} ...")
            stage_started = time.perf_counter()
            try:
                results += STAGES[name].run(ctx)
                statuses[name] = {"status": "ok"}
            except Exception as error:
                traceback.print_exc()
                statuses[name] = {"status": "error", "error": f"{type(error).__name__}: {error}"}
            statuses[name]["seconds"] = round(time.perf_counter() - stage_started, 2)
    finally:
        database.close()
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
    parser.add_argument("--rows", type=int, help="frame rows for pg_load and frame_conversion")
    parser.add_argument("--archive-mb", type=int, help="MiB of padding added to the archive")
    parser.add_argument("--repeats", type=int, help="timed repeats per side (median reported)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where latest.* go")
    parser.add_argument("--stack-home", type=Path, help="use (or start) the stack in this home")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the scratch directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config.quick_config() if args.quick else Config()
    overrides = {
        "rows": args.rows,
        "archive_padding_mb": args.archive_mb,
        "repeats": args.repeats,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    stages = args.stage or list(STAGES)
    report = run(
        stages, config, args.out, stack_home=args.stack_home, keep_workdir=args.keep_workdir
    )
    print()
    print(table(report["results"]))
    print(f"\nwritten: {args.out / 'latest.json'}, {args.out / 'latest.md'}")
    return 0 if all(s["status"] == "ok" for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
