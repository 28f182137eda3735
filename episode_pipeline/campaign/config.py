"""A campaign's rules, from `CampaignSettings` at `start`, kept on the campaign's row (JSON):
a campaign keeps the pacing it started with, whatever the driver's environment says later."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from episode_pipeline.campaign.canary import CanarySettings
from episode_pipeline.campaign.governor import GovernorSettings
from episode_pipeline.campaign.ledger import RetryPolicy
from episode_pipeline.campaign.waves import WaveSettings
from episode_pipeline.config.settings import CampaignSettings


@dataclass(frozen=True)
class CampaignConfig:
    waves: WaveSettings
    governor: GovernorSettings
    canary: CanarySettings
    retry: RetryPolicy
    stale_claim_seconds: float

    @classmethod
    def from_settings(
        cls, settings: CampaignSettings, expect: tuple[str, ...] = (), **overrides: Any
    ) -> CampaignConfig:
        values = {**asdict(settings), **{k: v for k, v in overrides.items() if v is not None}}
        return cls(
            waves=WaveSettings(
                wave_size=values["wave_size"],
                episodes_per_run=values["episodes_per_run"],
                max_live_partitions=max(values["max_live_partitions"], values["wave_size"]),
            ),
            governor=GovernorSettings(
                start_limit=values["concurrency_start"],
                min_limit=values["concurrency_min"],
                max_limit=values["concurrency_max"],
                increase_after=values["increase_after"],
                pause_seconds=values["pause_seconds"],
                max_pause_seconds=values["max_pause_seconds"],
                window=values["failure_window"],
                max_failure_rate=values["max_failure_rate"],
            ),
            canary=CanarySettings(
                episodes=values["canary_episodes"],
                fraction=values["canary_fraction"],
                seconds_tolerance=values["canary_seconds_tolerance"],
                frame_rows_tolerance=values["canary_frame_rows_tolerance"],
                expect=tuple(expect),
            ),
            retry=RetryPolicy(
                max_attempts=values["max_attempts"], base_seconds=values["retry_base_seconds"]
            ),
            stale_claim_seconds=values["stale_claim_seconds"],
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["canary"]["expect"] = list(self.canary.expect)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CampaignConfig:
        canary = dict(data["canary"])
        canary["expect"] = tuple(canary.get("expect", ()))
        return cls(
            waves=WaveSettings(**data["waves"]),
            governor=GovernorSettings(**data["governor"]),
            canary=CanarySettings(**canary),
            retry=RetryPolicy(**data["retry"]),
            stale_claim_seconds=float(data["stale_claim_seconds"]),
        )
