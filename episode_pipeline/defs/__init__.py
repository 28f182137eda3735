"""Dagster definitions, one package per concern: assets, checks, sensors, resources, IO."""

import warnings

from dagster import BetaWarning, PreviewWarning

# Used on purpose with the Dagster version pinned in pyproject: partitioned asset checks (preview)
# and a partitioned observable source asset (beta). Silence the per-import notices.
warnings.filterwarnings("ignore", category=PreviewWarning)
warnings.filterwarnings("ignore", category=BetaWarning)
