"""A program language has one home in the runtime: ``runtime_service/languages/``. No other
runtime module names one (a string ``"python"`` or ``"typescript"``), so none can branch on
it; the worker trees, per language by nature, are left out -- all but the fork server, which
runs every language's workers and names only their entries."""

from __future__ import annotations

import ast
from pathlib import Path

from runtime_service.languages import backends

ROOT = Path(__file__).resolve().parents[2] / "runtime_service"
EXCLUDED = ("languages", "worker", "worker_ts")
INCLUDED = (ROOT / "worker" / "zygote.py",)


def _scanned() -> list[Path]:
    files = [
        path
        for path in sorted(ROOT.rglob("*.py"))
        if path.relative_to(ROOT).parts[0] not in EXCLUDED
    ]
    return files + list(INCLUDED)


def _literals(path: Path, names: frozenset[str], base: Path = ROOT.parent) -> list[str]:
    """Each string constant of ``path`` that is one of ``names``, as ``file:line: 'name'``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(base)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_runtime_module_outside_languages_names_a_language() -> None:
    names = frozenset(backend.name for backend in backends())
    assert {"python", "typescript"} <= names
    files = _scanned()
    assert len(files) > 20 and ROOT / "runtime.py" in files
    found = [line for path in files for line in _literals(path, names)]
    assert found == []


def test_the_scan_sees_a_literal(tmp_path: Path) -> None:
    module = tmp_path / "branchy.py"
    module.write_text('def pick(language):\n    return language == "typescript"\n')
    found = _literals(module, frozenset({"python", "typescript"}), base=tmp_path)
    assert found == ["branchy.py:2: 'typescript'"]
