"""`episode-pipeline campaign plan|start|status|pause|resume|cancel`: reprocess the fleet in paced
waves (docs/operations.md#reprocess-the-fleet). The `campaign_driver` sensor does the work; these
commands write the campaign and its ledger, and read them back."""

from __future__ import annotations

import argparse
import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from episode_pipeline.campaign import canary, ledger
from episode_pipeline.campaign.canary import FIGURES
from episode_pipeline.campaign.capacity import (
    Capacity,
    Ceilings,
    Choice,
    PlanBasis,
    Prices,
    Workload,
    capacity,
    choose,
)
from episode_pipeline.campaign.config import CampaignConfig
from episode_pipeline.campaign.governor import GovernorState
from episode_pipeline.campaign.waves import estimate
from episode_pipeline.commands.common import local_stack_unless_production
from episode_pipeline.config.settings import Settings
from episode_pipeline.episodes.code_versions import code_version_digest
from episode_pipeline.reprocess import STATUSES, Selection, _episode, _since, selection_sql


def current_asset_graph(settings: Settings) -> Any:
    """The asset graph the code location deploys under these settings."""
    from episode_pipeline.definitions import build_definitions

    return build_definitions(settings).resolve_asset_graph()


def current_code_versions(settings: Settings, asset_graph: Any = None) -> dict[str, str]:
    """The versions the code location deploys under these settings (defs/code_versions.py)."""
    from episode_pipeline.defs.code_versions import code_versions

    return code_versions(asset_graph or current_asset_graph(settings))


def selection_of(args: argparse.Namespace, target: str) -> Selection:
    selection = Selection(
        tuple(args.episodes), args.org, args.status, args.since, target if args.stale else None
    )
    if selection.episodes and (args.org or args.status or args.since):
        raise ValueError("name episodes (with --stale or not) or give filters, not both")
    return selection


def episodes_query(conn: Any, selection: Selection) -> tuple[str, tuple[Any, ...]]:
    """The selection as one query of (org_id, episode_id): the ledger is filled from it."""
    if selection.episodes:
        values = ", ".join(["(%s, %s)"] * len(selection.episodes))
        params = tuple(v for ref in selection.episodes for v in (ref.org_id, ref.episode_id))
        query = f"SELECT * FROM (VALUES {values}) AS named (org_id, episode_id)"
        if selection.stale_for:  # the named ones not recorded under the target
            query += (
                " WHERE NOT EXISTS (SELECT 1 FROM episode_outputs o WHERE o.org_id ="
                " named.org_id AND o.episode_id = named.episode_id AND o.code_version = %s)"
            )
            params += (selection.stale_for,)
        return query, params
    from episode_pipeline.db.schema_check import read_schema

    schema = read_schema(conn)
    return selection_sql(selection, schema.has("episodes", "updated_at"))


def config_of(
    args: argparse.Namespace,
    settings: Settings,
    episodes_per_run: int | None = None,
    concurrency_max: int | None = None,
) -> CampaignConfig:
    """The campaign's rules: the settings, the flags, and what `--within` chose (K, the most)."""
    return CampaignConfig.from_settings(
        settings.campaign,
        expect=tuple(args.expect or ()),
        wave_size=args.wave_size,
        episodes_per_run=episodes_per_run or args.episodes_per_run,
        concurrency_start=args.concurrency,
        concurrency_max=max(
            args.concurrency or 0, concurrency_max or settings.campaign.concurrency_max
        ),
        canary_episodes=args.canary_episodes,
    )


# K tried by `--within`: up to a wave's worth (a batch is claimed within one wave).
WITHIN_MAX_EPISODES_PER_RUN = 100


def workload_of(run_seconds: float | None, measured: int) -> Workload:
    """One episode's demands: the batch benchmark's, with its own work measured when recorded
    (the median run's wall from its start to the episode processed: cold and worker start
    apart)."""
    if not run_seconds:
        return Workload()
    return Workload(
        episode_seconds=run_seconds, source=f"median of {measured} recorded run(s); the rest: "
        f"{Workload().source}"
    )  # fmt: skip


def capacity_of(
    count: int,
    config: CampaignConfig,
    settings: Settings,
    workload: Workload,
    within_hours: float | None,
) -> tuple[Capacity, Choice | None]:
    """The plan at the campaign's K and concurrency, and what `--within` chose."""
    from episode_pipeline.orchestration.campaigns import BACKFILL_LEAD_SECONDS

    campaign = settings.campaign
    ceilings = Ceilings.of(
        campaign,
        config.waves,
        lane=settings.campaign.concurrency_max,
        lead_seconds=2 * campaign.tick_seconds + BACKFILL_LEAD_SECONDS,  # as the driver's
    )
    basis = PlanBasis(
        workload,
        ceilings,
        Prices.of(campaign),
        start=config.governor.start_limit,
        increase_after=config.governor.increase_after,
    )
    planned = capacity(
        episodes=count,
        k=config.waves.episodes_per_run,
        concurrency=config.governor.max_limit,
        basis=basis,
    )
    if within_hours is None:
        return planned, None
    ks = range(1, min(config.waves.wave_size, WITHIN_MAX_EPISODES_PER_RUN) + 1)
    return planned, choose(episodes=count, hours=within_hours, ks=ks, basis=basis)


def campaign_id_for(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32] or "campaign"
    return f"{slug}-{secrets.token_hex(3)}"


def plan(conn: Any, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from episode_pipeline.db.campaigns import count_selection
    from episode_pipeline.db.outputs import measured_run_seconds

    graph = current_asset_graph(settings)
    versions = current_code_versions(settings, graph)
    target = code_version_digest(versions)
    selection = selection_of(args, target)
    query, params = episodes_query(conn, selection)
    # Issue 27's rule: a row the pipeline cannot key is skipped, counted and named, never fatal.
    selected = count_selection(conn, query, params)
    count = selected.episodes
    run_seconds, measured = measured_run_seconds(conn)
    workload = workload_of(run_seconds, measured)
    within = getattr(args, "within", None)
    config = config_of(args, settings)
    planned, choice = capacity_of(count, config, settings, workload, within)
    if choice is not None and choice.plan is not None:  # start runs what fits
        config = config_of(args, settings, choice.plan.episodes_per_run, choice.plan.concurrency)
        planned = choice.plan
    canary = config.canary.wave_size(count) if count else 0
    figures = estimate(
        episodes=count,
        settings=config.waves,
        concurrency=config.governor.start_limit,
        measured_run_seconds=run_seconds,
        measured_from=measured,
        canary_size=canary,
    )
    return {
        "selection": selection.describe(),
        "target_code_version": target,
        "code_versions": versions,
        "episodes": count,
        "examples": [ref.partition_key for ref in selected.examples],
        "skipped": selected.skipped,  # rows the pipeline cannot key: not in the campaign
        "skipped_rows": [row.describe() for row in selected.skipped_rows],
        "canary_wave": canary,
        "config": config.to_json(),
        "estimate": figures.as_dict(),
        **plan_assets_of(conn, settings, graph, versions, query, params, args),
        "capacity": planned.as_dict(),
        "within": choice.as_dict() if choice is not None else None,
        "_query": (query, params, selection),
    }


def format_plan(planned: dict[str, Any]) -> str:
    e, waves = planned["estimate"], planned["config"]["waves"]
    return "\n".join(
        [
            f"selection: {planned['selection']}",
            f"target code version: {planned['target_code_version']}",
            f"episodes selected: {planned['episodes']}"
            + (f" (e.g. {', '.join(planned['examples'])})" if planned["examples"] else ""),
            *skipped_lines(planned),
            f"waves: {e['waves']} (canary {planned['canary_wave']}, then up to "
            f"{waves['wave_size']} each), {e['runs']} run(s) of K={waves['episodes_per_run']}",
            *within_lines(planned["within"]),
            *capacity_lines(planned["capacity"]),
            *asset_lines(planned),
        ]
    )


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def capacity_lines(c: dict[str, Any]) -> list[str]:
    """The plan's limits as a table: each demand at the planned rate against its ceiling, the
    one that binds, the time to finish and the cost (docs/scale.md's table is this output)."""
    rows = [
        f"| {limit['name']} | {_figure(limit['demand'])} {limit['unit']} | "
        + (
            f"{_figure(limit['ceiling'])} | {limit['share']:.0%} | "
            + ("yes" if limit["within"] else "**no**")
            if limit["ceiling"]
            else "- | - | -"
        )
        + f" | {limit['source']} |"
        for limit in c["limits"]
    ]
    cost = c["cost_usd"]
    verdict = "fits" if c["fits"] else "does not fit"
    return [
        f"capacity at K={c['episodes_per_run']}, {c['concurrency']} run(s) at once: "
        f"{c['episodes_per_second']:.3g} episodes/s; {verdict} (each limit within "
        f"{c['headroom']:.0%} of its ceiling); binding: {c['binding']}",
        "",
        "| limit | demand | ceiling | share | within | source |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        *rows,
        "",
        f"time to finish: {c['hours_to_finish']} h ({c['ramp_hours']} h of it the governor's "
        f"climb); {c['task_hours']:,} task-hours",
        f"cost: ${cost['total']:,.2f} (Fargate ${cost['fargate']:,.2f}, S3 requests "
        f"${cost['s3']:,.2f}; CAMPAIGN_*_USD prices)",
        f"per episode: {c['workload']['source']}",
    ]


def within_lines(within: dict[str, Any] | None) -> list[str]:
    """What `--within HOURS` chose, or the limit that forbids it."""
    if within is None:
        return []
    if within["fits"]:
        chosen = within["plan"]
        return [
            f"within {within['within_hours']:g} h: K={chosen['episodes_per_run']}, "
            f"{chosen['concurrency']} run(s) at once (CAMPAIGN_EPISODES_PER_RUN, "
            "CAMPAIGN_CONCURRENCY_MAX; `campaign start --within` runs them)"
        ]
    limit: dict[str, Any] = within["forbidding"]
    nearest = within["nearest"]
    return [
        f"within {within['within_hours']:g} h: does not fit; {limit['name']} forbids it "
        f"({_figure(limit['demand'])} {limit['unit']} against {_figure(limit['ceiling'])}, "
        f"{limit['share']:.0%}, at K={nearest['episodes_per_run']} and "
        f"{nearest['concurrency']} run(s) at once, the nearest try; {limit['source']})"
    ]


def skipped_lines(planned: dict[str, Any]) -> list[str]:
    if not planned["skipped"]:
        return []
    named = planned["skipped_rows"]
    more = planned["skipped"] - len(named)
    return [
        f"skipped: {planned['skipped']} row(s) the pipeline cannot key (`episode-pipeline status"
        " --invalid` lists them; docs/operations.md#rows-the-pipeline-cannot-key)",
        *(f"  {row}" for row in named),
        *([f"  and {more} more"] if more > 0 else []),
    ]


def status(conn: Any, campaign_id: str, now: datetime | None = None) -> dict[str, Any]:
    from episode_pipeline.db import campaigns as db

    now = now or datetime.now(UTC)
    campaign = db.get_campaign(conn, campaign_id)
    if campaign is None:
        raise ValueError(
            f"no campaign {campaign_id!r} (episode-pipeline campaign status lists them)"
        )
    counts = db.state_counts(conn, campaign_id)
    total = sum(counts.values())
    done = counts.get(ledger.SUCCEEDED, 0)
    hour = db.succeeded_since(conn, campaign_id, now - timedelta(hours=1))
    elapsed = max(1.0, (now - campaign.created_at).total_seconds())
    rate = hour if elapsed >= 3600 else done * 3600 / elapsed  # episodes per hour
    remaining = total - done - counts.get(ledger.REJECTED, 0)
    governor = GovernorState.from_json(campaign.governor)
    return {
        "id": campaign.id,
        "name": campaign.name,
        "state": campaign.state,
        "selection": campaign.selection,
        "target_code_version": campaign.target_code_version,
        "episodes": total,
        "counts": {state: counts.get(state, 0) for state in ledger.EPISODE_STATES},
        "rate_per_hour": round(rate, 1),
        "eta_hours": round(remaining / rate, 2)
        if rate and remaining
        else (0 if not remaining else None),
        "concurrency": governor.limit,  # runs the run queue launches at once
        "measured_episodes_per_second": round(governor.episodes_per_second, 3),
        "paused_until": governor.paused_until.isoformat() if governor.is_paused(now) else None,
        "waves_started": campaign.next_wave,
        "stalled": (campaign.report or {}).get("stall"),  # campaign/progress.py: the cause
        "report": campaign.report,
        "errors_by_class": db.errors_by_class(conn, campaign_id),
        "decisions": db.decisions(conn, campaign_id, limit=10),
    }


def format_status(s: dict[str, Any]) -> str:
    c = s["counts"]
    lines = [
        f"campaign {s['id']} ({s['name']}): {s['state']}",
        f"  {c['succeeded']} done, {c['failed']} failed (to retry), {c['rejected']} rejected, "
        f"{c['requested']} in flight, {c['pending']} pending of {s['episodes']}",
        f"  rate {s['rate_per_hour']}/h, ETA "
        + (f"{s['eta_hours']} h" if s["eta_hours"] is not None else "unknown")
        + f"; concurrency {s['concurrency']} (pace {s['measured_episodes_per_second']}/s)"
        + (f", paused until {s['paused_until']}" if s["paused_until"] else "")
        + f"; {s['waves_started']} wave(s) started",
    ]
    if s.get("stalled"):
        lines.append(f"  STALLED ({s['stalled']['cause']}): {s['stalled']['message']}")
    if s["report"]:
        lines.append(f"  report: {json.dumps(s['report'])[:2000]}")
    for error in s["errors_by_class"]:
        lines.append(f"  errors {error['class']}: {error['episodes']} — {error['last_error']}")
    for decision in s["decisions"]:
        lines.append(f"  {decision['at'][:19]} {decision['kind']}: {decision['message']}")
    return "\n".join(lines)


def act(
    conn: Any,
    campaign_id: str,
    action: str,
    accept_no_baseline: bool = False,
    now: datetime | None = None,
) -> str:
    """pause | resume | cancel: the new state. A resume after the canary stopped the campaign
    accepts its findings; after it stopped for want of a baseline, only with
    `accept_no_baseline` (the operator's deliberate yes to going on without the comparison).
    A resume starts the progress clock again (campaign/progress.py)."""
    from episode_pipeline.db import campaigns as db

    campaign = db.lock_campaign(conn, campaign_id)
    if campaign is None:
        raise ValueError(f"no campaign {campaign_id!r}")
    new_state = ledger.campaign_action(campaign.state, action)
    values: dict[str, Any] = {"state": new_state}
    report = campaign.report or {}
    verdict = report.get("canary")
    if action == "resume":
        if verdict == canary.NO_BASELINE and not accept_no_baseline:
            raise ValueError(
                f"campaign {campaign_id}: the canary compared {report.get('compared', 0)} "
                f"episode(s) with figures from before ({report.get('required')} needed): no "
                "baseline to judge the change by. `campaign resume --accept-no-baseline` goes on "
                "without it"
            )
        report = {
            **report,
            "progress": {"at": (now or datetime.now(UTC)).isoformat(), "released": 0},
            "stall": None,
        }
        if verdict in (canary.FINDINGS, canary.NO_BASELINE):
            report["canary"] = "resumed"
        if verdict == canary.NO_BASELINE:
            report["accepted_no_baseline"] = True
        values["report"] = report
    db.update_campaign(conn, campaign_id, **values)
    accepted = (
        " (no canary baseline)" if action == "resume" and verdict == canary.NO_BASELINE else ""
    )
    db.log_decision(conn, campaign_id, "state", f"{action} by the operator: {new_state}{accepted}")
    return new_state


def cancel_backfills(instance: Any, campaign_id: str, waves: int) -> int:
    """After the cancel: hold the campaign's launches at 0 at once, and cancel its waves still
    requested in Dagster (their queued runs go too). A wave a driver tick claimed before the
    cancel and records after it is canceled by the next tick (orchestration/campaigns.py: a canceled
    campaign's requested backfills)."""
    from episode_pipeline.instance.campaign_queue import hold
    from episode_pipeline.orchestration.campaigns import cancel_wave_backfill

    hold(instance, campaign_id)
    return sum(cancel_wave_backfill(instance, campaign_id, wave) for wave in range(waves))


def cmd_campaign(args: argparse.Namespace) -> int:
    from episode_pipeline.db.connection import connect
    from episode_pipeline.local.stack_env import apply_local_stack_env, load_settings

    local_stack_unless_production()
    apply_local_stack_env()  # the local instance's DAGSTER_HOME, unless production's are set
    settings = load_settings()
    with connect(settings.database) as conn:
        if args.action in ("plan", "start"):
            planned = plan(conn, settings, args)
            query, params, selection = planned.pop("_query")
            if args.action == "start" and planned["within"] and not planned["within"]["fits"]:
                raise ValueError("\n".join(within_lines(planned["within"])))
            if args.action == "plan":
                planned.pop(ASSETS_INTERNAL, None)
                print(json.dumps(planned, indent=2) if args.json else format_plan(planned))
                return 0
            from dagster import DagsterInstance

            with DagsterInstance.get() as instance:
                campaign_id, count = start(conn, instance, planned, query, params, selection, args)
                conn.commit()
            print(
                f"campaign {campaign_id}: {count} episode(s); the `campaign_driver` sensor runs it"
            )
            print(format_plan(planned))
            return 0
        if args.action == "status":
            if args.campaign is None:
                from episode_pipeline.db import campaigns as db

                rows = [
                    {
                        "id": c.id,
                        "name": c.name,
                        "state": c.state,
                        "created_at": c.created_at,
                        "stalled": ((c.report or {}).get("stall") or {}).get("cause"),
                    }
                    for c in db.all_campaigns(conn)
                ]
                if args.json:
                    print(json.dumps(rows, indent=2, default=str))
                else:
                    for row in rows:
                        stalled = f"  STALLED ({row['stalled']})" if row["stalled"] else ""
                        print(
                            f"{row['id']}  {row['state']:9}  "
                            f"{row['created_at']:%Y-%m-%d %H:%M}  {row['name']}{stalled}"
                        )
                return 0
            result = status(conn, args.campaign)
            print(json.dumps(result, indent=2, default=str) if args.json else format_status(result))
            return 0
        if args.campaign is None:
            raise ValueError(f"campaign {args.action} needs the campaign's id")
        if args.accept_no_baseline and args.action != "resume":
            raise ValueError("--accept-no-baseline goes with `campaign start` or `resume`")
        new_state = act(conn, args.campaign, args.action, args.accept_no_baseline)
        conn.commit()
        print(f"campaign {args.campaign}: {new_state}")
        if args.action == "cancel":
            from episode_pipeline.db import campaigns as db

            campaign = db.get_campaign(conn, args.campaign)
            assert campaign is not None
            from dagster import DagsterInstance

            with DagsterInstance.get() as instance:
                canceled = cancel_backfills(instance, args.campaign, campaign.next_wave)
            print(f"canceled {canceled} wave backfill(s)")
    return 0


def start(
    conn: Any,
    instance: Any,
    planned: dict[str, Any],
    query: str,
    params: tuple[Any, ...],
    selection: Selection,
    args: argparse.Namespace,
) -> tuple[str, int]:
    """Write the campaign and its ledger (the caller commits) and register it with this Dagster
    instance, whose driver runs it; (its id, its episodes)."""
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.instance.app_state import register_campaign

    if not planned["episodes"]:
        skipped = f" ({planned['skipped']} row(s) skipped: unkeyable)" if planned["skipped"] else ""
        raise ValueError(f"no episode matches {selection.describe()}{skipped}: nothing to start")
    config = CampaignConfig.from_json(planned["config"])
    name = args.name or f"reprocess {selection.describe()}"
    campaign_id = campaign_id_for(args.name or "campaign")
    count = db.create_campaign(
        conn,
        campaign_id,
        name,
        {
            "describe": selection.describe(),
            **_selection_json(args),
            "skipped": planned["skipped"],
            **campaign_assets_json(planned),
        },
        planned["target_code_version"],
        config.to_json(),
        GovernorState.start(config.governor).to_json(),
        query,
        params,
    )
    db.log_decision(conn, campaign_id, "state", f"started over {count} episode(s)")
    record_asset_selection(conn, campaign_id, planned)
    if planned["skipped"]:
        db.log_decision(
            conn,
            campaign_id,
            "selection",
            f"skipped {planned['skipped']} row(s) the pipeline cannot key: "
            + "; ".join(planned["skipped_rows"][:3]),
            {"skipped": planned["skipped"], "rows": planned["skipped_rows"]},
        )
    if getattr(args, "accept_no_baseline", False):  # known up front: no figures from before
        db.update_campaign(conn, campaign_id, report={"accept_no_baseline": True})
        db.log_decision(conn, campaign_id, "canary", "no baseline accepted at start")
    register_campaign(instance, campaign_id)
    return campaign_id, count


def _selection_json(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "episodes": [ref.partition_key for ref in args.episodes],
        "org": args.org,
        "status": args.status,
        "since": args.since.isoformat() if args.since else None,
        "stale": bool(args.stale),
    }


def add_campaign_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "campaign",
        help="reprocess the fleet in paced, resumable waves (plan first)",
        description="A campaign reprocesses a selection (the `reprocess` filters, or --stale: "
        "every episode not recorded under the code version now deployed) in waves the "
        "`campaign_driver` sensor paces: a canary wave first, a governor (AIMD) on the "
        "concurrency, a ledger in PostgreSQL (docs/operations.md#reprocess-the-fleet).",
    )
    parser.add_argument("action", choices=["plan", "start", "status", "pause", "resume", "cancel"])
    parser.add_argument("campaign", nargs="?", help="the campaign's id (status, pause, ...)")
    parser.add_argument(
        "--episode",
        dest="episodes",
        action="append",
        type=_episode,
        default=[],
        metavar="ORG/EP",
        help="a named episode (repeatable)",
    )
    parser.add_argument("--org", help="every episode of this org")
    parser.add_argument("--status", choices=STATUSES, help="episodes with this status")
    parser.add_argument("--since", type=_since, help="episodes whose row changed since (UTC)")
    parser.add_argument(
        "--stale",
        action="store_true",
        help="episodes not processed by the code version now deployed",
    )
    parser.add_argument("--name", help="the campaign's name (titles its waves' backfills)")
    parser.add_argument("--wave-size", type=int, help="episodes per wave at most")
    parser.add_argument("--episodes-per-run", type=int, help="K: episodes per campaign run")
    parser.add_argument(
        "--concurrency", type=int, help="campaign runs launched at once at the start"
    )
    parser.add_argument("--canary-episodes", type=int, help="the canary wave's size at most")
    parser.add_argument(
        "--within",
        type=float,
        metavar="HOURS",
        help="plan or start: choose K and the concurrency that finish within HOURS, or say "
        "which limit forbids it (docs/scale.md#a-million-episodes-in-a-day)",
    )
    parser.add_argument(
        "--expect",
        action="append",
        choices=FIGURES,
        help="a figure the change means to change: the canary ignores it",
    )
    parser.add_argument(
        "--accept-no-baseline",
        action="store_true",
        help="start or resume: go on although the canary has no figures from before to compare "
        "(the first campaign after migration 004)",
    )
    parser.add_argument(
        "--whole-graph",
        action="store_true",
        help="run every asset of each episode, not only those whose code version changed and "
        "what depends on them",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=cmd_campaign)


# -- the asset selection: the changed assets and those downstream (campaign/assets.py) ---------

ASSETS_INTERNAL = "_assets"  # what `start` records beyond the plan's JSON


def plan_assets_of(
    conn: Any,
    settings: Settings,
    graph: Any,
    versions: dict[str, str],
    query: str,
    params: tuple[Any, ...],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The plan's `assets`: which assets the campaign runs, which episodes run the whole graph
    and why. The episodes the selection serves are HEADed for the stored outputs it loads (one
    HEAD each, in parallel): one without them runs the whole graph, counted here."""
    from episode_pipeline.campaign import assets as rules
    from episode_pipeline.db.campaigns import episodes_recorded_under, recorded_groups
    from episode_pipeline.defs.code_versions import asset_children, stored_in_s3
    from episode_pipeline.defs.io_managers.s3_outputs import missing_stored_outputs
    from episode_pipeline.defs.jobs import EPISODE_ASSETS
    from episode_pipeline.storage.bucket import Bucket

    children = asset_children(graph)
    groups = recorded_groups(conn, query, params)
    chosen = rules.plan_assets(
        [(recorded, n) for _, recorded, n in groups], versions, children, EPISODE_ASSETS
    )
    if getattr(args, "whole_graph", False):
        chosen = rules.AssetPlan(None, chosen.whole_graph, 0, {})
    digests: list[str] = []
    missing = []
    stored: list[str] = []
    if chosen.assets is not None:
        digests = [
            digest
            for digest, recorded, _ in groups
            if digest and recorded and set(versions) <= set(recorded)
        ]
        stored = sorted(rules.stored_inputs(chosen.assets, children))
        served = episodes_recorded_under(conn, query, params, digests)
        missing = missing_stored_outputs(
            Bucket(settings.bucket, settings.aws), stored_in_s3(graph, stored), served
        )
        chosen = rules.with_missing_outputs(chosen, len(missing))
    changed = sorted(
        set().union(
            *(
                rules.changed_assets(recorded, versions)
                for _, recorded, _ in groups
                if recorded and set(versions) <= set(recorded)
            )
        )
    )
    return {
        "assets": {**chosen.as_json(), "changed": changed, "loaded_as_stored": stored},
        ASSETS_INTERNAL: {
            "digests": digests,
            "missing": [ref.partition_key for ref in missing],
        },
    }


def asset_lines(planned: dict[str, Any]) -> list[str]:
    """The plan's lines on the assets it runs (text output)."""
    chosen = planned.get("assets")
    if not chosen:
        return []
    if chosen["whole_graph"]:
        return [f"assets to run: the whole graph ({', '.join(chosen['assets'])})"]
    lines = [
        f"assets to run: {', '.join(chosen['assets'])} (changed: {', '.join(chosen['changed'])};"
        f" loaded as stored: {', '.join(chosen['loaded_as_stored']) or 'nothing'})"
    ]
    if chosen["episodes_whole_graph"]:
        reasons = ", ".join(f"{n} {why}" for why, n in chosen["whole_graph_reasons"].items())
        lines.append(
            f"  the whole graph for {chosen['episodes_whole_graph']} episode(s) ({reasons}),"
            " in waves of their own"
        )
    return lines


def campaign_assets_json(planned: dict[str, Any]) -> dict[str, Any]:
    """What the campaign row keeps of the selection (`selection.assets`): the driver's every
    tick, a restarted daemon's too, reads it there. Absent: the whole graph."""
    chosen = planned.get("assets")
    if not chosen or chosen["whole_graph"]:
        return {}
    return {"assets": chosen["assets"]}


def record_asset_selection(conn: Any, campaign_id: str, planned: dict[str, Any]) -> None:
    """Flag the ledger's episodes that run the whole graph, and say so in the decisions."""
    from episode_pipeline.db import campaigns as db
    from episode_pipeline.episodes.keys import parse_partition_key

    chosen = planned.get("assets")
    internal = planned.get(ASSETS_INTERNAL)
    if not chosen or chosen["whole_graph"] or internal is None:
        return
    missing = [parse_partition_key(key) for key in internal["missing"]]
    whole = db.mark_whole_graph(conn, campaign_id, internal["digests"], missing)
    db.log_decision(
        conn,
        campaign_id,
        "selection",
        f"runs {', '.join(chosen['assets'])}; the whole graph for {whole} episode(s)",
        {
            "assets": chosen["assets"],
            "episodes_whole_graph": whole,
            "digests": internal["digests"],
            "missing_stored_outputs": internal["missing"][: db.SKIPPED_NAMED],
        },
    )
