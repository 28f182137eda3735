"""One digest of the code versions that produced an episode (pure).

The code versions are the assets' own `code_version`s as the definitions set them, settings
folded in (`defs/code_versions.py`); this digest is what the durable record (`episode_outputs`)
and a campaign's stale selection compare.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping


def code_version_digest(versions: Mapping[str, str]) -> str:
    """12 hex digits of the sorted `{asset: version}`: equal maps, equal digests."""
    text = json.dumps(dict(sorted(versions.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
