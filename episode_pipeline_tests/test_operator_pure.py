"""The pure half of the operator's commands: unwrapping Dagster's errors into a cause, the
per-step lines of `process`, and the stack status that never shows the password."""

from __future__ import annotations

import pytest

from episode_pipeline.commands.process import StepEvent, format_steps, step_lines, summary_line
from episode_pipeline.diagnosis import CheckFailure, one_line_cause
from episode_pipeline.local.aws_setup import QueueTiming
from episode_pipeline.local.stack import StackInfo
from episode_pipeline.orchestration.run_errors import StepError, step_error
from episode_pipeline_tests.support.dagster_internals import SerializableErrorInfo


def wrapped(cls_name: str, message: str) -> SerializableErrorInfo:
    inner = SerializableErrorInfo(f"pkg.mod.{cls_name}: {message}", [], cls_name)
    return SerializableErrorInfo(
        "dagster._core.errors.DagsterExecutionStepExecutionError: Error executing op 'x'",
        [],
        "DagsterExecutionStepExecutionError",
        cause=inner,
    )


def test_the_users_error_is_found_under_dagsters_wrapper_and_named_once() -> None:
    error = step_error("extracted_files", wrapped("CorruptArchive", "s3://b/k: not zstd"), "x")
    assert error == StepError("extracted_files", "CorruptArchive", "s3://b/k: not zstd")


def test_a_long_message_shows_its_first_lines_and_says_it_goes_on() -> None:
    error = StepError("frames", "ValueError", "one\n\ntwo\nthree\nfour")
    assert error.first_lines() == ["one", "two", "three", "…"]


def test_the_cause_is_the_first_failed_step_else_the_first_error_check() -> None:
    warn = CheckFailure("frames_state_present", "frames", "WARN", "state present", None)
    error = CheckFailure("frames_match_parquet_rows", "frames", "ERROR", "rows match", "3 != 4")
    assert one_line_cause([], [warn]) is None  # a WARN check does not explain a failure
    assert one_line_cause([], [warn, error]) == "check frames_match_parquet_rows failed: 3 != 4"
    step = StepError("episode", "EpisodeNotFound", "no row\nmore")
    assert one_line_cause([step], [error]) == "episode: EpisodeNotFound: no row"
    run_level = StepError(None, "failure", "worker died")
    assert one_line_cause([run_level], []) == "failure: worker died"


def events(*rows: tuple) -> list[StepEvent]:
    return [StepEvent(*row) for row in rows]


def test_steps_in_start_order_with_their_checks_folded_in() -> None:
    lines = step_lines(
        events(
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "frames"),
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "extracted_files"),
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "episode"),
            (0.0, "ASSET_CHECK_EVALUATION_PLANNED", "frames_rows", "frames"),
            (0.0, "ASSET_CHECK_EVALUATION_PLANNED", "frames_state", "frames"),
            (1.0, "STEP_START", "extracted_files"),
            (2.5, "STEP_SUCCESS", "extracted_files"),
            (3.0, "STEP_START", "frames"),
            (4.0, "STEP_SUCCESS", "frames"),
            (4.1, "STEP_START", "frames_rows"),
            (4.2, "ASSET_CHECK_EVALUATION", "frames_rows", "frames", "rows", True, "ERROR"),
            (4.2, "STEP_SUCCESS", "frames_rows"),
            (4.3, "ASSET_CHECK_EVALUATION", "frames_state", "frames", "state", False, "WARN"),
            (5.0, "STEP_START", "episode"),
            (6.0, "STEP_FAILURE", "episode", None, None, None, None, "EpisodeNotFound: no row"),
        )
    )
    assert [(line.step, line.outcome) for line in lines] == [
        ("extracted_files", "ok"),
        ("frames", "ok"),
        ("episode", "FAILED"),
    ]
    assert lines[0].seconds == 1.5
    text = format_steps(lines)
    assert "checks: state FAILED (WARN), 1 passed" in text[1]
    assert text[2].endswith("EpisodeNotFound: no row")
    assert summary_line(lines) == "2/3 steps ok, 2 checks (1 failed)"


def test_a_family_step_that_raised_names_each_check_left_without_a_result() -> None:
    # One step runs the checks of two assets (defs/checks/family.py); one evaluated, then the
    # other raised: the raised one is listed on its own asset's line, the evaluated one once.
    lines = step_lines(
        events(
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "episode"),
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "episode_metadata"),
            (0.0, "ASSET_CHECK_EVALUATION_PLANNED", "rows_checks", "episode_metadata", "keys"),
            (0.0, "ASSET_CHECK_EVALUATION_PLANNED", "rows_checks", "episode", "count"),
            (1.0, "STEP_START", "episode"),
            (2.0, "STEP_SUCCESS", "episode"),
            (3.0, "STEP_START", "episode_metadata"),
            (4.0, "STEP_SUCCESS", "episode_metadata"),
            (5.0, "STEP_START", "rows_checks"),
            (
                5.1,
                "ASSET_CHECK_EVALUATION",
                "rows_checks",
                "episode_metadata",
                "keys",
                True,
                "ERROR",
            ),
            (5.2, "STEP_FAILURE", "rows_checks", None, None, None, None, "OperationalError: x"),
        )
    )
    by_step = {line.step: line for line in lines}
    assert [line.outcome for line in lines] == ["ok", "ok"]  # a check step is no asset line
    assert by_step["episode"].checks == [("count", False, "raised OperationalError: x")]
    assert by_step["episode_metadata"].checks == [("keys", True, "ERROR")]
    assert summary_line(lines) == "2/2 steps ok, 2 checks (1 failed)"


def test_a_step_that_never_ran_is_listed_last_as_not_run() -> None:
    lines = step_lines(
        events(
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "hls_renditions"),
            (0.0, "ASSET_MATERIALIZATION_PLANNED", "extracted_files"),
            (1.0, "STEP_START", "extracted_files"),
            (2.0, "STEP_FAILURE", "extracted_files", None, None, None, None, "CorruptArchive: x"),
        )
    )
    assert [(line.step, line.outcome) for line in lines] == [
        ("extracted_files", "FAILED"),
        ("hls_renditions", "not run"),
    ]


def test_stack_status_masks_the_password_everywhere() -> None:
    info = StackInfo(
        running=True,
        home="/h",
        database_url="postgresql://postgres:s3cret@127.0.0.1:5/episodes",
        env={"DB_PASSWORD": "s3cret", "DB_HOST": "127.0.0.1"},
        s3_endpoint="http://127.0.0.1:6",
    )
    shown = info.redacted()
    assert "s3cret" not in shown.describe() and "s3cret" not in str(shown.as_dict())
    assert shown.database_url == "postgresql://postgres:***@127.0.0.1:5/episodes"
    assert info.env["DB_PASSWORD"] == "s3cret"  # the state itself is unchanged


def test_queue_timing_defaults_to_production_and_scales_the_heartbeat() -> None:
    default = QueueTiming()
    assert default.env() == {
        "SQS_VISIBILITY_TIMEOUT_SECONDS": "900",
        "SQS_HEARTBEAT_SECONDS": "240",
        "SQS_MAX_RECEIVE_COUNT": "3",
    }
    assert QueueTiming(20, 2).heartbeat_seconds == 5
    recorded = QueueTiming(20, 2).env()
    assert QueueTiming.from_env({}, recorded) == QueueTiming(20, 2)  # kept
    assert QueueTiming.from_env({"SQS_MAX_RECEIVE_COUNT": "5"}, recorded) == QueueTiming(20, 5)
    with pytest.raises(ValueError, match="SQS_VISIBILITY_TIMEOUT_SECONDS=2"):
        QueueTiming(2, 3)
    with pytest.raises(ValueError, match="SQS_MAX_RECEIVE_COUNT='x'"):
        QueueTiming.from_env({"SQS_MAX_RECEIVE_COUNT": "x"}, {})
