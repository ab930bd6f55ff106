"""Code, tests and the schema cite only what is in this repository: no section numbers or test
ids of documents that live elsewhere, no "issue N", no design files outside `docs/`. A comment
says why in its own words or links into docs/; a reader of the repository alone can follow it."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".js", ".ts", ".proto", ".mjs", ".json"}
# Generated code (regenerated from the protos, whose comments this test covers), installed
# packages, build outputs and local traces.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "dist", "var", "test-output"}
SKIPPED_PATHS = {ROOT / "codemode_wire" / "api", ROOT / "clients" / "typescript" / "src" / "gen"}

# Spelled in pieces so that this file does not match itself.
SECTION = "\u00a7"
CITATIONS = re.compile(
    "|".join(
        [
            r"reference " + SECTION,
            SECTION + r"\s?[0-9]",
            r"original-behaviour",
            r"design/cordis",
            r"(?<!docs/)architecture\.md",
            r"measurements\.md",
            r"style\.md",
            r"seeds/",
            r"\bseed 0[0-9]{2}\b",
            r"\bissue [0-9]+",
            r"\bT-[A-Z]+-[0-9]+",  # test ids of an outside specification
        ]
    )
)


def sources() -> list[Path]:
    found: list[Path] = []
    for directory, subdirs, files in os.walk(ROOT):  # symlinks are not followed
        here = Path(directory)
        subdirs[:] = [
            name
            for name in subdirs
            if name not in SKIPPED_DIRS and here / name not in SKIPPED_PATHS
        ]
        found.extend(here / name for name in files if Path(name).suffix in SUFFIXES)
    return found


def test_the_scan_sees_the_code() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in sources()}
    assert "registry_service/domain/execution.py" in names
    assert "proto/codemode/runtime/v1/runtime.proto" in names
    assert "runtime_service/worker_ts/worker.js" in names
    assert not any(name.startswith("codemode_wire/api/") for name in names)


def test_no_code_test_or_proto_cites_a_document_outside_the_repository() -> None:
    hits = []
    for path in sources():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if CITATIONS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "cite the repository (docs/...) or say why:\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_are_for() -> None:
    for cited in [
        "(reference " + SECTION + "9.5)",
        "(" + SECTION + "1.9)",
        "design/cordis" + ".md",
        "issue" + " 14",
        "T-WIRE" + "-9",
        "../reference/original" + "-behaviour.md",
        "see architecture" + ".md",
    ]:
        assert CITATIONS.search(cited), cited
    for fine in ["docs/architecture.md", "docs/cordis.md", "an issue with it", "T-shirt"]:
        assert not CITATIONS.search(fine), fine
