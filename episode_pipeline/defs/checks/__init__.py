"""The asset checks, one module per asset family and one step per module (`family.py`); each
names its asset by key and imports no asset module. They run with every materialization and on
their own as tests of an episode's state."""

from episode_pipeline.defs.checks.episode import EPISODE_ROW_CHECKS
from episode_pipeline.defs.checks.extracted_files import EXTRACTED_FILES_CHECKS
from episode_pipeline.defs.checks.frames import FRAMES_CHECKS
from episode_pipeline.defs.checks.hls import HLS_CHECKS

EPISODE_CHECKS = [*EXTRACTED_FILES_CHECKS, *FRAMES_CHECKS, *HLS_CHECKS, *EPISODE_ROW_CHECKS]
