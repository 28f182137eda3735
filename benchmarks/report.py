"""A benchmark run's report: the terminal's table and the ``latest.md`` beside ``latest.json``.

Its own module so that `run` (every stage) and `fleet` (the report of a stopped fleet run) both
use it without importing each other.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 2  # 2: baseline_name, samples and spread, target and met per figure


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
