"""The per-episode archive limits as a Dagster resource: shown in the UI, set from `Settings`.

The extraction refuses an archive over any of them with a named error (docs/faults.md); the
values and their environment variables are declared on `config.settings.ArchiveLimits`.
"""

from __future__ import annotations

from episode_pipeline.config.settings import ArchiveLimits
from episode_pipeline.defs.resources.settings_fields import SettingsFields, settings_resource

_ARCHIVE_LIMITS = SettingsFields(ArchiveLimits)


class ArchiveLimitsResource(settings_resource(_ARCHIVE_LIMITS)):
    """Ceilings on one uploaded archive (ARCHIVE_* variables): a field for each of them."""

    @classmethod
    def from_settings(cls, limits: ArchiveLimits) -> ArchiveLimitsResource:
        return cls(**_ARCHIVE_LIMITS.values(limits))

    def get_limits(self) -> ArchiveLimits:
        return _ARCHIVE_LIMITS.read(self)
