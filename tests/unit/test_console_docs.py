"""The console's docs say what a Client half is given: the parameter table of console/README.md
is exactly the parameters console/page/frame.ts evaluates a half with, and no page names a UI
toolkit as passed in when the frame passes none (the docs once said React was not passed in
while it was, then the other way round)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLKITS = ("react", "reactdom", "preact", "vue", "solid")


def _frame_parameters() -> list[str]:
    source = (ROOT / "console" / "page" / "frame.ts").read_text()
    (call,) = re.findall(r"new AsyncFunction\(([^)]*)\)", source)
    return re.findall(r'"([^"]+)"', call)  # the last argument (the half's code) is unquoted


def _readme_parameters() -> list[str]:
    text = (ROOT / "console" / "README.md").read_text()
    table = text.split("| parameter | what it is |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)


def test_the_readme_lists_exactly_the_parameters_a_client_half_gets() -> None:
    assert _readme_parameters() == _frame_parameters()


def test_no_ui_toolkit_is_passed_and_the_docs_say_so() -> None:
    assert not {p.lower() for p in _frame_parameters()} & set(TOOLKITS)
    for page in (ROOT / "console" / "README.md", ROOT / "docs" / "cli.md"):
        assert "no UI toolkit is passed in" in page.read_text(), page
