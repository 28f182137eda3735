"""The local Dagster instance: production's dagster.yaml but for the differences named below.

`instance_config` loads the repository's `dagster.yaml` (the file the production image copies
to DAGSTER_HOME) and applies `local_differences`, one table of what a laptop must change, each
with its reason: the storage connection (the embedded PostgreSQL, not Aurora with IAM tokens),
the run launcher (a worker process, not an ECS task), compute logs (files, not the S3 bucket),
the run queue's limits sized for 2 cores, and the sensor threads (`dev`'s Ctrl-C). Everything
else, `run_retries` and run monitoring included, is production's: the webserver, the daemon of
`dev` and every test daemon run the Dagster that production runs. A test
(test_instance_config.py) fails on any difference not in the table and on an `env:` reference
of production's left in the local instance; docs/architecture.md#the-local-instance lists the
table, written from it (`python -m episode_pipeline.local.dagster_home`).

The storage URL uses `postgresql+psycopg2://`: with SQLAlchemy 2.1 a bare `postgresql://` selects
psycopg 3, and dagster-postgres's `NOTIFY run_events, $1` then fails
(docs/platform-notes.md#dagster-storage-url).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

PRODUCTION_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml"

MAX_CONCURRENT_RUNS = 2  # a laptop has few cores; FFmpeg runs fill them
# The whole run's deadline, production's (dagster.yaml): past it run monitoring terminates the
# run and fails it. A run whose worker died is failed sooner, at the next poll
# (`instance/run_launcher.py`).
RUN_MAX_RUNTIME_SECONDS = 2 * 3600


class Removed:
    """A difference's value: the key is absent locally."""

    def __repr__(self) -> str:
        return "(removed)"


REMOVED = Removed()


class Difference(NamedTuple):
    value: Any  # the local value, or REMOVED
    why: str


STORAGES = ("run_storage", "event_log_storage", "schedule_storage")


def storage_url(password: str, port: int, database: str = "dagster") -> str:
    return f"postgresql+psycopg2://postgres:{password}@127.0.0.1:{port}/{database}"


def local_differences(url: str) -> dict[str, Difference]:
    """Every way the local instance differs from production's dagster.yaml, by path, and why.

    A path is dot-separated keys; `[key=org]` selects the item of a list whose `key` is `org`."""
    connection = {
        "postgres_url": Difference(
            url, "the embedded PostgreSQL of the local stack (`stack up`), its port and password"
        ),
        "postgres_db": Difference(
            REMOVED, "Aurora's host, port, database and user come from the ECS environment"
        ),
        "auth_provider": Difference(
            REMOVED, "RDS IAM tokens; the embedded PostgreSQL has a password"
        ),
    }
    limits = "run_coordinator.config.tag_concurrency_limits"
    return {
        **{
            f"{storage}.config.{key}": difference
            for storage in STORAGES
            for key, difference in connection.items()
        },
        "run_launcher": Difference(
            {"module": "episode_pipeline.instance.run_launcher", "class": "LocalRunLauncher"},
            "no ECS: each run in a worker process of the code server, whose health run "
            "monitoring checks by its pid",
        ),
        "run_monitoring.max_resume_run_attempts": Difference(
            0,
            "a worker process cannot be resumed (Dagster refuses the instance otherwise): a "
            "dead worker's run is failed, then retried by `run_retries`",
        ),
        "compute_logs": Difference(
            REMOVED,
            "no compute-log bucket: Dagster's default, files under DAGSTER_HOME",
        ),
        "run_coordinator.config.max_concurrent_runs": Difference(
            MAX_CONCURRENT_RUNS, "2 cores: each run's FFmpeg fills one"
        ),
        # `org` is instance/run_tags.ORG_TAG, spelled here: importing it loads Dagster into every
        # stack start (0.6 s); apply_differences fails on a key dagster.yaml does not have.
        f"{limits}[key=org].limit": Difference(
            1,
            "2 slots: one run per org, so an org's uploads go in arrival order and one busy "
            "org cannot take both",
        ),
        "run_coordinator.config.dequeue_interval_seconds": Difference(
            1,
            "a run starts in seconds on a laptop (on ECS a task's start dwarfs 5 s); the "
            "dequeue query is one cheap read",
        ),
        "sensors.use_threads": Difference(
            False,
            "ticks one after another: with the thread pool, a tick started while `dev` shuts "
            "down fails (DagsterCodeLocationNotFoundError), about one Ctrl-C in three",
        ),
    }


def production_config() -> dict[str, Any]:
    """Production's dagster.yaml, each block its own copy (the storages share a YAML anchor)."""
    return _unshared(yaml.safe_load(PRODUCTION_YAML.read_text()))


def _unshared(config: Any) -> Any:
    """A copy sharing no dict with another (deepcopy keeps the anchor's one dict for three)."""
    return json.loads(json.dumps(config))


_ITEM = re.compile(r"^(?P<name>[^\[]+)\[(?P<field>[^=\]]+)=(?P<value>[^\]]+)\]$")


def _steps(path: str) -> Iterator[tuple[str, tuple[str, str] | None]]:
    """`a.b[key=org].c` as (key, list selector or None) steps."""
    for part in path.split("."):
        match = _ITEM.match(part)
        if match:
            yield match["name"], (match["field"], match["value"])
        else:
            yield part, None


def _item(items: list[Any], field: str, value: str, path: str) -> dict[str, Any]:
    found = [item for item in items if isinstance(item, dict) and item.get(field) == value]
    if len(found) != 1:
        raise KeyError(f"{path}: {len(found)} items with {field}={value}")
    return found[0]


def apply_differences(
    config: dict[str, Any], differences: Mapping[str, Difference]
) -> dict[str, Any]:
    """`config` (a copy) with each path set to its value or removed. A selected list item must
    exist once: a difference never silently applies to nothing."""
    config = _unshared(config)
    for path, difference in differences.items():
        steps = list(_steps(path))
        node: Any = config
        for index, (key, selector) in enumerate(steps):
            last = index == len(steps) - 1
            if selector is not None:
                node = _item(node[key], *selector, path)
                continue
            if not last:
                node = node.setdefault(key, {})
            elif difference.value is REMOVED:
                node.pop(key, None)
            else:
                node[key] = copy.deepcopy(difference.value)
    return config


def config_differences(production: Any, local: Any, path: str = "") -> list[str]:
    """The paths where `local` differs from `production` (a list of tag limits by its `key`)."""
    if isinstance(production, dict) and isinstance(local, dict):
        found: list[str] = []
        for key in [*production, *(k for k in local if k not in production)]:
            child = f"{path}.{key}" if path else str(key)
            if key not in production or key not in local:
                found.append(child)
            else:
                found += config_differences(production[key], local[key], child)
        return found
    if _keyed(production) and _keyed(local):
        by_key = {item["key"]: item for item in production}
        theirs = {item["key"]: item for item in local}
        found = []
        for key in [*by_key, *(k for k in theirs if k not in by_key)]:
            child = f"{path}[key={key}]"
            if key not in by_key or key not in theirs:
                found.append(child)
            else:
                found += config_differences(by_key[key], theirs[key], child)
        return found
    return [] if production == local else [path]


def _keyed(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "key" in i for i in value)


def unnamed_differences(
    production: dict[str, Any], local: dict[str, Any], named: Mapping[str, Difference]
) -> list[str]:
    """Paths where `local` differs from `production` that no named difference covers (a named
    path covers everything under it)."""
    return [
        path
        for path in config_differences(production, local)
        if not any(path == name or path.startswith((f"{name}.", f"{name}[")) for name in named)
    ]


def env_references(config: Any, path: str = "") -> list[str]:
    """Paths of `{env: NAME}` values (Dagster's environment-variable source)."""
    if isinstance(config, dict):
        if set(config) == {"env"}:
            return [path]
        return [r for k, v in config.items() for r in env_references(v, f"{path}.{k}".lstrip("."))]
    if isinstance(config, list):
        return [r for i, v in enumerate(config) for r in env_references(v, f"{path}[{i}]")]
    return []


def instance_config(password: str, port: int, *, database: str = "dagster") -> dict[str, Any]:
    """dagster.yaml for the local instance (pure but for reading production's file)."""
    url = storage_url(password, port, database)
    return apply_differences(production_config(), local_differences(url))


# The storages production names (dagster.yaml), pooled (instance/storage.py).
POOLED_STORAGE_CLASSES = {
    "run_storage": ("episode_pipeline.instance.storage", "PooledPostgresRunStorage"),
    "event_log_storage": ("episode_pipeline.instance.storage", "PooledEpisodeEventLogStorage"),
    "schedule_storage": ("episode_pipeline.instance.storage", "PooledPostgresScheduleStorage"),
}

POOL_SETTINGS = ("pool_size", "max_overflow", "pool_recycle_seconds")  # instance/storage.py

# The same without the pool (a new connection per statement): the local instance before issue
# 27, now only the baseline of benchmarks/local_burst.py.
UNPOOLED_STORAGE_CLASSES = {
    "run_storage": ("dagster_postgres.run_storage", "PostgresRunStorage"),
    "event_log_storage": ("episode_pipeline.instance.event_log_storage", "EpisodeEventLogStorage"),
    "schedule_storage": ("dagster_postgres.schedule_storage", "PostgresScheduleStorage"),
}


def storage_config(postgres: dict[str, Any], *, pooled: bool = True) -> dict[str, Any]:
    """The instance's storage blocks, all on one database (the benchmarks swap them); the
    unpooled classes take no pool settings."""
    classes = POOLED_STORAGE_CLASSES if pooled else UNPOOLED_STORAGE_CLASSES
    if not pooled:
        postgres = {k: v for k, v in postgres.items() if k not in POOL_SETTINGS}
    return {
        block: {"module": module, "class": cls, "config": postgres}
        for block, (module, cls) in classes.items()
    }


DOC_URL = "postgresql+psycopg2://postgres:<password>@127.0.0.1:<port>/dagster"


def differences_table(differences: Mapping[str, Difference] | None = None) -> str:
    """The Markdown table of docs/architecture.md#the-local-instance."""
    rows = ["| path in `dagster.yaml` | local value | why |", "| --- | --- | --- |"]
    for path, (value, why) in (differences or local_differences(DOC_URL)).items():
        shown = "removed" if value is REMOVED else f"`{_inline(value)}`"
        rows.append(f"| `{path}` | {shown} | {why} |")
    return "\n".join(rows) + "\n"


def _inline(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_inline(v)}" for k, v in value.items()) + "}"
    return str(value)


def write_dagster_yaml(dagster_home: Path, password: str, port: int) -> Path:
    """(Re)write dagster.yaml; the port may change between starts, so it is written every time."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    path = dagster_home / "dagster.yaml"
    text = (
        "# Generated by episode_pipeline.local.stack on every `stack up` from the repository's\n"
        "# dagster.yaml and local/dagster_home.py's differences; edits are overwritten.\n"
        + yaml.safe_dump(instance_config(password, port), sort_keys=False)
    )
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def initialize_instance(dagster_home: Path) -> None:
    """Create Dagster's tables once, so the webserver and daemon do not race to create them."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.get_runs_count()


DOC = Path("docs/architecture.md")
DOC_START = "<!-- local differences: written by `python -m episode_pipeline.local.dagster_home` -->"
DOC_END = "<!-- end of local differences -->"


def documented(text: str) -> str:
    """`text` (docs/architecture.md) with its differences table rewritten from the code."""
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    return f"{head}{DOC_START}\n{differences_table()}{DOC_END}{tail}"


if __name__ == "__main__":
    DOC.write_text(documented(DOC.read_text()))
