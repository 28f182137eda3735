"""PostgresPolarsIOManager against the embedded PostgreSQL and the shared `frames` table."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import polars as pl
import psycopg
import pytest
from dagster import (
    AssetIn,
    AssetKey,
    DagsterInstance,
    DynamicPartitionsDefinition,
    asset,
    materialize,
)

from episode_pipeline.config.settings import Settings
from episode_pipeline.db.partition_tables import (
    PartitionTable,
    RowBatches,
    SkippedRows,
    TableMismatch,
)
from episode_pipeline.defs.io_managers.postgres_tables import PostgresPolarsIOManager
from episode_pipeline.defs.resources.database import PostgresResource
from episode_pipeline.episodes.keys import EpisodeRef

pytestmark = pytest.mark.integration

EPISODES = DynamicPartitionsDefinition(name="pg_io_test_episodes")
FRAMES_METADATA = PartitionTable("frames", "episode_id", order_by="frame_order").as_metadata()


@pytest.fixture(scope="module")
def manager(settings: Settings) -> PostgresPolarsIOManager:
    return PostgresPolarsIOManager(postgres=PostgresResource.from_settings(settings.database))


@pytest.fixture
def new_episode(
    episode_row: Callable[[], EpisodeRef], instance: DagsterInstance
) -> Callable[[], EpisodeRef]:
    """A fresh episode: its `episodes` row (frames has an FK) and its dynamic partition."""

    def make() -> EpisodeRef:
        ref = episode_row()
        instance.add_dynamic_partitions(EPISODES.name, [ref.partition_key])
        return ref

    return make


def frames_frame(n: int, *, start: int = 0, seed: float = 0.0) -> pl.DataFrame:
    """`n` rows shaped like the frames asset's output (no episode_id: the manager adds it)."""
    return pl.DataFrame(
        {
            "frame_order": list(range(n)),
            "lerobot_episode_index": [0] * n,
            "frame_index": [i if i % 2 == 0 else None for i in range(n)],
            "timestamp_ms": [(start + i) * 33 for i in range(n)],
            "observation": [{"state": [seed + i, seed - i]} for i in range(n)],
            "action": [[seed + i * 0.5] if i % 3 else None for i in range(n)],
        },
        schema_overrides={"frame_index": pl.Int32, "lerobot_episode_index": pl.Int32},
    )


def db_rows(db_conn: psycopg.Connection, ref: EpisodeRef) -> list[tuple]:
    return db_conn.execute(
        "SELECT frame_order, frame_index, timestamp_ms, observation, action FROM frames "
        "WHERE episode_id = %s ORDER BY frame_order",
        (ref.episode_id,),
    ).fetchall()


def materialize_frames(
    manager: PostgresPolarsIOManager,
    instance: DagsterInstance,
    ref: EpisodeRef,
    frame: pl.DataFrame,
    *,
    with_reader: bool = False,
):
    """Materialize a `frames` asset returning `frame` (and optionally a reader of it)."""
    seen: dict[str, pl.DataFrame] = {}

    @asset(name="frames", partitions_def=EPISODES, metadata=FRAMES_METADATA, io_manager_key="pg")
    def frames_asset() -> pl.DataFrame:
        return frame

    @asset(partitions_def=EPISODES, ins={"frames": AssetIn(AssetKey("frames"))})
    def reader(frames: pl.DataFrame) -> None:
        seen["frames"] = frames

    result = materialize(
        [frames_asset, reader] if with_reader else [frames_asset],
        partition_key=ref.partition_key,
        instance=instance,
        resources={"pg": manager},
    )
    assert result.success
    return result, seen.get("frames")


def test_write_load_and_replace_through_dagster(
    manager: PostgresPolarsIOManager,
    instance: DagsterInstance,
    db_conn: psycopg.Connection,
    new_episode: Callable[[], EpisodeRef],
) -> None:
    ref, other = new_episode(), new_episode()
    materialize_frames(manager, instance, other, frames_frame(4, seed=100.0))

    result, loaded = materialize_frames(manager, instance, ref, frames_frame(5), with_reader=True)
    metadata = result.asset_materializations_for_node("frames")[0].metadata
    assert metadata["rows_written"].value == 5
    assert metadata["table"].value == "public.frames"
    assert metadata["rows_per_second"].value > 0

    # The reader got exactly this episode's rows, in frame_order, jsonb as text.
    assert loaded is not None
    assert loaded.height == 5
    assert set(loaded.get_column("episode_id").to_list()) == {ref.episode_id}
    assert loaded.get_column("frame_order").to_list() == [0, 1, 2, 3, 4]
    assert loaded.schema["timestamp_ms"] == pl.Int64
    assert loaded.schema["observation"] == pl.String
    assert json.loads(loaded.get_column("observation")[1]) == {"state": [1.0, -1.0]}

    # Re-write with different values: same count, no duplicates, new values.
    materialize_frames(manager, instance, ref, frames_frame(5, seed=7.0))
    rows = db_rows(db_conn, ref)
    assert [row[0] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[0][3] == {"state": [7.0, 7.0]}

    # The other episode is untouched.
    assert len(db_rows(db_conn, other)) == 4
    assert db_rows(db_conn, other)[0][3] == {"state": [100.0, 100.0]}


def test_nulls_round_trip_as_null(
    manager: PostgresPolarsIOManager,
    db_conn: psycopg.Connection,
    new_episode: Callable[[], EpisodeRef],
) -> None:
    ref = new_episode()
    frame = frames_frame(3).with_columns(pl.lit(ref.episode_id).alias("episode_id"))
    manager.replace("frames", frame, "episode_id", ref.episode_id)  # column already present
    rows = db_rows(db_conn, ref)
    # frame_index 1 and action 0 were None: SQL NULL, not 0, '' or the JSON literal null.
    assert rows[1][1] is None
    assert rows[0][4] is None
    assert db_conn.execute(
        "SELECT count(*) FROM frames WHERE episode_id = %s AND action IS NULL", (ref.episode_id,)
    ).fetchone() == (1,)
    loaded = manager.select("frames", "episode_id", [ref.episode_id], order_by="frame_order")
    assert loaded.get_column("frame_index").to_list() == [0, None, 2]
    assert loaded.get_column("action").to_list()[0] is None


def _not_null_in_last_row() -> tuple[pl.DataFrame, type[Exception]]:
    bad = frames_frame(6, seed=2.0)
    observations = bad.get_column("observation").to_list()
    observations[-1] = None  # NOT NULL violation in the last row
    return bad.with_columns(pl.Series("observation", observations)), psycopg.errors.NotNullViolation


def _second_batch_fails() -> tuple[RowBatches, type[Exception]]:
    def batches():
        yield frames_frame(3, seed=2.0)
        raise OSError("the second data file could not be read")

    return RowBatches([batches()], frames_frame(0).schema), OSError


@pytest.mark.parametrize("bad_rows", [_not_null_in_last_row, _second_batch_fails])
def test_failed_copy_leaves_the_old_rows(
    manager: PostgresPolarsIOManager,
    db_conn: psycopg.Connection,
    new_episode: Callable[[], EpisodeRef],
    bad_rows: Callable[[], tuple[pl.DataFrame | RowBatches, type[Exception]]],
) -> None:
    ref = new_episode()
    manager.replace("frames", frames_frame(3, seed=1.0), "episode_id", ref.episode_id)
    before = db_rows(db_conn, ref)

    rows, error = bad_rows()
    with pytest.raises(error):
        manager.replace("frames", rows, "episode_id", ref.episode_id)
    assert db_rows(db_conn, ref) == before


def test_row_batches_are_copied_part_by_part_a_skipped_part_leaving_no_rows(
    manager: PostgresPolarsIOManager,
    instance: DagsterInstance,
    db_conn: psycopg.Connection,
    new_episode: Callable[[], EpisodeRef],
) -> None:
    ref = new_episode()
    produced: list[int] = []

    def part(starts: tuple[int, ...], fails_after: bool = False):
        for start in starts:
            produced.append(start)
            yield frames_frame(4, start=start).with_columns(pl.col("frame_order") + start)
        if fails_after:
            raise SkippedRows("this file turned out unreadable after its first batch")

    @asset(name="frames", partitions_def=EPISODES, metadata=FRAMES_METADATA, io_manager_key="pg")
    def streamed() -> RowBatches:
        # Three parts (files); the middle one is abandoned part-way: none of its rows stay.
        parts = [part((0, 4)), part((100,), fails_after=True), part((8,))]
        return RowBatches(parts, frames_frame(0).schema, lambda: {"batches_made": len(produced)})

    result = materialize(
        [streamed], partition_key=ref.partition_key, instance=instance, resources={"pg": manager}
    )
    assert result.success
    metadata = result.asset_materializations_for_node("frames")[0].metadata
    assert metadata["rows_written"].value == 12
    # Known only after the last batch was made: the producer's metadata comes after the COPY.
    assert metadata["batches_made"].value == 4
    assert [row[0] for row in db_rows(db_conn, ref)] == list(range(12))


def test_text_with_backslashes_tabs_and_newlines_round_trips(
    manager: PostgresPolarsIOManager, db_conn: psycopg.Connection
) -> None:
    table = f"pgio_text_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE TABLE {table} (part text NOT NULL, n integer, label text, doc jsonb)")
    labels = ["back\\slash", "tab\there", "two\nlines", "cr\rhere", "", None, r"\N"]
    docs = [{"k": "line\nbreak"}, {"k": "a\\b"}, None, {"k": "\t"}, {}, {"k": ""}, {"k": "N"}]
    try:
        frame = pl.DataFrame(
            {"n": list(range(len(labels))), "label": labels, "doc": [json.dumps(d) for d in docs]}
        ).with_columns(pl.when(pl.col("n") == 2).then(None).otherwise(pl.col("doc")).alias("doc"))
        assert manager.replace(table, frame, "part", "p1") == len(labels)
        rows = db_conn.execute(f"SELECT label, doc FROM {table} ORDER BY n").fetchall()
        assert [row[0] for row in rows] == labels
        assert [row[1] for row in rows] == [None if i == 2 else d for i, d in enumerate(docs)]
    finally:
        db_conn.execute(f"DROP TABLE {table}")


def test_empty_frame_deletes_the_partition(
    manager: PostgresPolarsIOManager,
    db_conn: psycopg.Connection,
    new_episode: Callable[[], EpisodeRef],
) -> None:
    ref, other = new_episode(), new_episode()
    manager.replace("frames", frames_frame(3), "episode_id", ref.episode_id)
    manager.replace("frames", frames_frame(2), "episode_id", other.episode_id)
    assert manager.replace("frames", frames_frame(0), "episode_id", ref.episode_id) == 0
    assert db_rows(db_conn, ref) == []
    assert len(db_rows(db_conn, other)) == 2


def test_unknown_columns_name_the_table_and_the_columns(
    manager: PostgresPolarsIOManager, new_episode: Callable[[], EpisodeRef]
) -> None:
    ref = new_episode()
    frame = frames_frame(1).with_columns(pl.lit(1).alias("camera"), pl.lit(2).alias("fps"))
    with pytest.raises(TableMismatch, match=r"public\.frames has no column\(s\) camera, fps"):
        manager.replace("frames", frame, "episode_id", ref.episode_id)
    with pytest.raises(TableMismatch, match=r"table public\.no_such_table does not exist"):
        manager.replace("no_such_table", frame, "episode_id", ref.episode_id)


def test_an_unpartitioned_asset_is_refused_and_the_table_kept(
    manager: PostgresPolarsIOManager, db_conn: psycopg.Connection
) -> None:
    table = f"pgio_whole_{uuid.uuid4().hex[:8]}"
    db_conn.execute(f"CREATE TABLE {table} (id integer NOT NULL, label text)")
    db_conn.execute(f"INSERT INTO {table} VALUES (7, 'kept')")
    try:

        @asset(name=table, io_manager_key="pg")
        def whole() -> pl.DataFrame:
            return pl.DataFrame({"id": [1, 2], "label": ["", None]})

        with pytest.raises(ValueError, match="refuses to replace a whole table"):
            materialize([whole], resources={"pg": manager})
        assert db_conn.execute(f"SELECT id, label FROM {table}").fetchall() == [(7, "kept")]
    finally:
        db_conn.execute(f"DROP TABLE {table}")
