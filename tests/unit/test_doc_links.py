"""Every relative link in README.md and docs/*.md points at a file of this repository, and every
`#anchor` at a heading of the page it names (GitHub's heading slugs), so the map and the design
pages cannot drift apart from the tree or from each other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a link inside code is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for line in prose_lines(page.read_text(encoding="utf-8"))
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto: ...
    ]


def test_the_pages_exist() -> None:
    assert (ROOT / "docs" / "README.md").is_file()
    assert len(PAGES) > 2


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slugs_follow_github() -> None:
    assert slug("Try it: `codemode demo --cordis`") == "try-it-codemode-demo---cordis"
    assert slug("The plugin host façade") == "the-plugin-host-façade"
    assert slug("Providers' message limit") == "providers-message-limit"
    assert slug("Plugin hosts (Cordis host halves)") == "plugin-hosts-cordis-host-halves"
