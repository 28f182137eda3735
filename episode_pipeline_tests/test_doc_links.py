"""Every pointer into the docs lands on a heading that exists.

A pointer is a relative link in a Markdown file (`[text](operations.md#a-heading)`, `(#a-heading)`)
or a `path.md#anchor` written anywhere in the repository: in the docs' text and code spans, and
in the code, where it is printed to a user (`make demo`'s last lines) or sends a reader to the
reason for a choice. An anchor resolves when the file has a heading whose GitHub anchor is it.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from functools import cache
from itertools import pairwise
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
# `path.md#anchor` in any text; not inside a URL (`https://…/README.md#x` is someone else's page).
MENTION = re.compile(r"(?<![\w./:-])([\w./-]*\.md)#([\w-]+)")
_PARSER = MarkdownIt("commonmark").enable("table")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text: lower case, punctuation dropped (hyphens and
    underscores kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings; a repeated heading gets `-1`, `-2`, …"""
    tokens = _PARSER.parse(path.read_text())
    seen: Counter[str] = Counter()
    found = set()
    for opening, inline in pairwise(tokens):
        if opening.type != "heading_open":
            continue
        text = "".join(
            child.content
            for child in inline.children or []
            if child.type in ("text", "code_inline")
        )
        anchor = github_anchor(text)
        found.add(f"{anchor}-{seen[anchor]}" if seen[anchor] else anchor)
        seen[anchor] += 1
    return frozenset(found)


def links(path: Path) -> list[str]:
    """The targets of a Markdown file's links and images."""
    targets = []
    for token in _PARSER.parse(path.read_text()):
        for child in token.children or []:
            target = child.attrs.get("href") or child.attrs.get("src")
            if isinstance(target, str):
                targets.append(target)
    return targets


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def broken(target_file: Path, anchor: str | None) -> str | None:
    """Why `target_file#anchor` does not resolve, or None when it does."""
    if not target_file.is_file():
        return "no such file"
    if anchor and target_file.suffix == ".md" and anchor not in anchors(target_file):
        headings = ", ".join(sorted(anchors(target_file)))
        return f"no heading with anchor #{anchor} (the file's anchors: {headings})"
    return None


def pointers() -> list[tuple[str, Path, str | None]]:
    """(where it is written, the file it points at, the anchor or None)."""
    found = []
    for path in tracked_files():
        if path == Path(__file__).resolve():
            continue  # this module's examples of the syntax point nowhere on purpose
        where = path.relative_to(ROOT)
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # an image or another binary file
        if path.suffix == ".md":
            for target in links(path):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                name, _, anchor = target.partition("#")
                linked = path.parent / name if name else path  # `(#anchor)`: this file
                found.append((f"{where}: link ({target})", linked, anchor or None))
        for line_number, line in enumerate(text.splitlines(), 1):
            for match in MENTION.finditer(line):
                name, anchor = match.groups()
                # In a doc, a name is relative to the doc (a link's rule) or to the repository.
                candidates = [path.parent / name, ROOT / name] if path.suffix == ".md" else []
                target = next((c for c in candidates if c.is_file()), ROOT / name)
                found.append((f"{where}:{line_number}: {match.group(0)}", target, anchor))
    return found


def test_github_anchors_follow_githubs_rule() -> None:
    assert github_anchor("A tour of the UI") == "a-tour-of-the-ui"
    assert github_anchor("`process`: one episode, quietly") == "process-one-episode-quietly"
    assert github_anchor("What keeps running, and how to stop it") == (
        "what-keeps-running-and-how-to-stop-it"
    )
    assert github_anchor("Why 3 days (the UI's curve)") == "why-3-days-the-uis-curve"
    assert github_anchor("upload_record_days / retention") == "upload_record_days--retention"


def test_a_repeated_heading_and_a_fenced_comment(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Notes\n\n## Run it\n\n```bash\n# not a heading\n```\n\n## Run it\n")
    assert anchors(doc) == {"notes", "run-it", "run-it-1"}
    assert broken(doc, "not-a-heading") is not None and broken(doc, "run-it-1") is None
    assert broken(tmp_path / "missing.md", None) == "no such file"


def test_the_pointers_are_found_where_they_are_written() -> None:
    written = {where.split(":")[0] for where, _, _ in pointers()}
    # A doc's links, a doc's text, and the code (what `make demo` prints among it).
    assert {"README.md", "docs/operations.md", "episode_pipeline/local/demo.py"} <= written


def test_every_pointer_resolves() -> None:
    found = pointers()
    assert len(found) > 100  # the docs point into each other everywhere
    failures = [
        f"{where}: {reason}"
        for where, target, anchor in found
        if (reason := broken(target, anchor))
    ]
    assert not failures, "\n".join(failures)
