"""`python -m episode_pipeline.config [FILE]`: write the table of every variable into FILE
(docs/configuration.md), between its two table markers."""

from __future__ import annotations

import sys
from pathlib import Path

from episode_pipeline.config.env import variables_table
from episode_pipeline.config.settings import Settings

BEGIN = "<!-- variables table: written by `python -m episode_pipeline.config` -->\n"
END = "<!-- end of the variables table -->\n"
DOC = Path("docs/configuration.md")


def with_table(text: str) -> str:
    """`text` with the part between the markers replaced by today's table."""
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the table markers are missing: {BEGIN.strip()} ... {END.strip()}")
    return f"{head}{BEGIN}{variables_table(Settings)}{END}{tail}"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DOC
    path.write_text(with_table(path.read_text()))
    print(f"wrote the variables table into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
