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
    bucket = s3.get_client()
    problems = []
    for file in extracted_files.files:
        head = bucket.head(file.key)
        if head is None:
            problems.append({"key": file.key, "problem": "missing"})
        elif head.size != file.size:
            problems.append({"key": file.key, "problem": f"size {head.size} != {file.size}"})
    return AssetCheckResult(
        passed=not problems,
        metadata={
            "objects_checked": len(extracted_files.files),
            "problems": MetadataValue.json(problems),
        },
    )


EXTRACTED_FILES_CHECKS = [family.definition()]
