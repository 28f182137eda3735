"""The per-episode archive limits as a Dagster resource: shown in the UI, set from `Settings`.

The extraction refuses an archive over any of them with a named error (docs/faults.md); the
values and their environment variables are declared on `config.settings.ArchiveLimits`.
"""

from __future__ import annotations

from dagster import ConfigurableResource

from episode_pipeline.config.settings import ArchiveLimits
from episode_pipeline.defs.resources.settings_fields import (
    resource_values,
    setting_field,
    settings_from,
)


class ArchiveLimitsResource(ConfigurableResource):
    """Ceilings on one uploaded archive (ARCHIVE_* variables)."""

    max_member_bytes: int = setting_field(ArchiveLimits, "max_member_bytes")
    max_total_bytes: int = setting_field(ArchiveLimits, "max_total_bytes")
    max_members: int = setting_field(ArchiveLimits, "max_members")
    max_ratio: float = setting_field(ArchiveLimits, "max_ratio")
    ratio_grace_bytes: int = setting_field(ArchiveLimits, "ratio_grace_bytes")
    max_path_depth: int = setting_field(ArchiveLimits, "max_path_depth")
    max_path_bytes: int = setting_field(ArchiveLimits, "max_path_bytes")
    max_metadata_bytes: int = setting_field(ArchiveLimits, "max_metadata_bytes")

    @classmethod
    def from_settings(cls, limits: ArchiveLimits) -> ArchiveLimitsResource:
        return cls(**resource_values(limits))

    def get_limits(self) -> ArchiveLimits:
        return settings_from(self, ArchiveLimits)
