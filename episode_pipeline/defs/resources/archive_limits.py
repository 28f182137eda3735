"""The per-episode archive limits as a Dagster resource: shown in the UI, set from `Settings`.

The extraction refuses an archive over any of them with a named error (docs/faults.md); the
values and their environment variables are documented on `settings.ArchiveLimits`.
"""

from __future__ import annotations

import dataclasses

from dagster import ConfigurableResource
from pydantic import Field

from episode_pipeline.config.settings import ArchiveLimits

_DEFAULTS = ArchiveLimits()


class ArchiveLimitsResource(ConfigurableResource):
    """Ceilings on one uploaded archive (ARCHIVE_* variables)."""

    max_member_bytes: int = Field(default=_DEFAULTS.max_member_bytes)
    max_total_bytes: int = Field(
        default=_DEFAULTS.max_total_bytes, description="The decompressed tar stream."
    )
    max_members: int = Field(default=_DEFAULTS.max_members)
    max_ratio: float = Field(
        default=_DEFAULTS.max_ratio, description="Decompressed / compressed bytes."
    )
    ratio_grace_bytes: int = Field(
        default=_DEFAULTS.ratio_grace_bytes,
        description="Decompressed bytes before the ratio is checked.",
    )
    max_path_depth: int = Field(default=_DEFAULTS.max_path_depth)
    max_path_bytes: int = Field(default=_DEFAULTS.max_path_bytes)
    max_metadata_bytes: int = Field(
        default=_DEFAULTS.max_metadata_bytes, description="Files read into memory (info.json)."
    )

    @classmethod
    def from_settings(cls, limits: ArchiveLimits) -> ArchiveLimitsResource:
        return cls(**dataclasses.asdict(limits))

    def get_limits(self) -> ArchiveLimits:
        return ArchiveLimits(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(ArchiveLimits)}
        )
