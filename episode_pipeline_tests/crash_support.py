"""Test-only pieces the crash tests load into a real `dagster-daemon` process.

`PausingRunCoordinator` is production's run queue (`EpisodeRunCoordinator`) with one injection
point after a run is submitted: the daemon has created and queued the run a sensor requested,
but has not yet finished the tick. The crash tests name it in their private instance's dagster.yaml.
"""

from __future__ import annotations

from episode_pipeline.instance.run_coordinator import EpisodeRunCoordinator
from episode_pipeline.instance.run_tags import PARTITION_TAG
from episode_pipeline.runtime.injection_points import reach
from episode_pipeline_tests.support.dagster_internals import SubmitRunContext

AFTER_SUBMIT_RUN = "daemon.after_submit_run"


class PausingRunCoordinator(EpisodeRunCoordinator):
    def submit_run(self, context: SubmitRunContext):  # type: ignore[override]
        run = super().submit_run(context)
        reach(AFTER_SUBMIT_RUN, about=run.tags.get(PARTITION_TAG, ""))
        return run
