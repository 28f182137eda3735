"""The upload queue's three sensors: names, intervals, status; what each tick does is
`orchestration/upload_runs.py` (where an upload becomes a run)."""

from __future__ import annotations

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunStatusSensorContext,
    SensorDefinition,
    SensorEvaluationContext,
    run_status_sensor,
    sensor,
)

from episode_pipeline.config.settings import QueueSettings, TranscodeSettings
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.defs.resources.sqs import UploadQueueResource
from episode_pipeline.instance.run_tags import EPISODE_JOB_NAME
from episode_pipeline.orchestration.upload_runs import (
    evaluate_heartbeat,
    evaluate_upload_done,
    evaluate_uploads,
)

UPLOADS_SENSOR_NAME = "episode_uploads"
UPLOAD_DONE_SENSOR_NAME = "episode_upload_done"
HEARTBEAT_SENSOR_NAME = "episode_upload_heartbeat"
UPLOADS_INTERVAL_SECONDS = 10


def upload_queue_sensors(
    queue_settings: QueueSettings | None = None, transcode: TranscodeSettings | None = None
) -> list[SensorDefinition]:
    """The three upload-queue sensors; the heartbeat ticks at `QueueSettings.heartbeat_seconds`,
    and each run the uploads sensor requests is placed by `transcode`."""
    queue_settings = queue_settings or QueueSettings()

    @sensor(
        name=UPLOADS_SENSOR_NAME,
        job_name=EPISODE_JOB_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=UPLOADS_INTERVAL_SECONDS,
        description="Receives upload notifications from SQS: one successful run per uploaded "
        "object version (a redelivery joins the run, or is deleted once it succeeded). "
        "Messages are deleted when their run succeeds.",
    )
    def episode_uploads(
        context: SensorEvaluationContext, upload_queue: UploadQueueResource, s3: S3BucketResource
    ):
        return evaluate_uploads(context, upload_queue.get_client(), s3.get_client(), transcode)

    @run_status_sensor(
        name=UPLOAD_DONE_SENSOR_NAME,
        run_status=DagsterRunStatus.SUCCESS,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=10,
        description="Deletes a run's upload messages from SQS once the run succeeded.",
    )
    def episode_upload_done(
        context: RunStatusSensorContext, upload_queue: UploadQueueResource
    ) -> None:
        # Always None: a run-status sensor stops its tick at the first run it returns something
        # for, and a tick that saw both a reaction and a SkipReason fails without moving its
        # cursor, so one mixed pair of runs would wedge it for good.
        evaluate_upload_done(context, upload_queue.get_client())

    @sensor(
        name=HEARTBEAT_SENSOR_NAME,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=queue_settings.heartbeat_seconds,
        description="Renews the SQS visibility of upload messages whose runs are queued or "
        f"running (back to {queue_settings.visibility_timeout_seconds} s, every "
        f"{queue_settings.heartbeat_seconds} s), so they are not delivered again mid-run.",
    )
    def episode_upload_heartbeat(
        context: SensorEvaluationContext, upload_queue: UploadQueueResource
    ):
        return evaluate_heartbeat(context, upload_queue.get_client())

    return [episode_uploads, episode_upload_done, episode_upload_heartbeat]


UPLOAD_QUEUE_SENSORS = upload_queue_sensors()
episode_uploads, episode_upload_done, episode_upload_heartbeat = UPLOAD_QUEUE_SENSORS
