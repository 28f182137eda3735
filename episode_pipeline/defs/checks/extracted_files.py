"""The check of `extracted_files`: what it lists is in S3."""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from episode_pipeline.defs.asset_keys import EXTRACTED_FILES_KEY
from episode_pipeline.defs.checks.family import (
    EXTRACTED_FILES_INS,
    EpisodeCheckContext,
    EpisodeCheckFamily,
)
from episode_pipeline.defs.resources.s3 import S3BucketResource
from episode_pipeline.episodes.extracted_files import ExtractedFiles
from episode_pipeline.episodes.output_checks import object_problems

family = EpisodeCheckFamily("extracted_files_checks", ins=EXTRACTED_FILES_INS)


@family.check(
    asset=EXTRACTED_FILES_KEY,
    severity=AssetCheckSeverity.ERROR,
    blocking=True,
    description="Every file `extracted_files` lists exists in S3 with the recorded size (ERROR).",
)
def processed_objects_exist(
    context: EpisodeCheckContext, extracted_files: ExtractedFiles, s3: S3BucketResource
) -> AssetCheckResult:
    problems = object_problems(s3.get_client(), extracted_files.files)
    return AssetCheckResult(
        passed=not problems,
        metadata={
            "objects_checked": len(extracted_files.files),
            "problems": MetadataValue.json(problems),
        },
    )


EXTRACTED_FILES_CHECKS = [family.definition()]
