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
SCHEMA_VERSION = 2  # 2: baseline_name, samples and spread, target and met per figure


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
    if factor == 0:  # ours measured nothing (a throughput of 0): no ratio to read
        return "ours 0"
    unit = row["unit"]
    speed = unit == "s" or "/" in unit
    if factor >= 1:
        return f"{factor:.2f}x {'faster' if speed else 'less'}"
    return f"{1 / factor:.2f}x {'slower' if speed else 'more'}"


def _spread(row: dict[str, Any]) -> str:
    """`a..b` over the repeats of ours (the figure's own noise), or `-`."""
    spread = row.get("ours_spread")
    return f"{_format(spread[0])}..{_format(spread[1])}" if spread else "-"


def _met(row: dict[str, Any]) -> str:
    met = row.get("met")
    return "-" if met is None else ("yes" if met else "**no**")


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table for the terminal."""
    header = ("stage", "metric", "ours", "baseline", "unit", "verdict", "target met", "against")
    lines = [
        (
            r["stage"],
            r["metric"],
            _format(r["ours"]),
            _format(r["baseline"]),
            r["unit"],
            _verdict(r),
            _met(r).strip("*"),
            r.get("baseline_name", "")[:60],
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in [header, *lines]
    )


def results_table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of every figure: what it is against, median, spread, target."""
    out = [
        "| stage | figure | ours (median, spread) | baseline | against | ours vs baseline "
        "| target | met |",
        "| --- | --- | ---: | ---: | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['stage']} | {r['metric']} | {_format(r['ours'])} {r['unit']} ({_spread(r)}) "
            f"| {_format(r['baseline'])} | {r.get('baseline_name', '')} | {_verdict(r)} "
            f"| {r.get('target') or '-'} | {_met(r)} |"
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    """The short summary committed next to latest.json."""
    machine = report["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
    config = report["config"]
    out = [
        "# Benchmark results",
        "",
        f"Generated {report['generated_at']} by `python -m benchmarks.run"
        f"{' --quick' if config['quick'] else ''}` in {report['total_seconds']:.0f} s at commit "
        f"{(machine['git_commit'] or '-')[:12]}, load average {report['facts'].get('load', '-')}"
        ". Every baseline was measured in this run on the same data; *ours vs baseline* reads "
        f"the ratio so that > 1 means ours wins; medians of {config['repeats']} repeats.",
        "",
        *results_table(report["results"]),
    ]
    failed = {k: v for k, v in report["stages"].items() if v["status"] != "ok"}
    for name, status in failed.items():
        out.append(f"\n**{name} failed:** `{status.get('error', '')}`")
    out += [
        "",
        f"Machine: {machine['cores']} cores ({machine['cores_usable']} usable), "
        f"{machine['cpu']}, {machine['memory_gib']} GiB RAM, {machine['platform']}; "
        f"Python {machine['python']}; {packages}; PostgreSQL {report['facts'].get('postgres', '-')}"
        f"; {machine['zstd'] or 'no zstd'}; {machine['tar'] or 'no tar'}.",
        "",
        "Sizes: " + ", ".join(f"{k} {v}" for k, v in config.items() if k != "quick") + ".",
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
