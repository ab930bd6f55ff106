"""The container image definition: lint-clean, built from the locks, non-root by default, and a
build context that holds every package the project installs (there is no Docker engine here)."""

from __future__ import annotations

import tomllib

from tests.deploy.support import ROOT, run, tool

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
            pending = ""
    return found


def test_hadolint_is_clean() -> None:
    result = run([tool("hadolint"), str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_final_stage_runs_both_services_as_non_root() -> None:
    steps = instructions()
    stages = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(stages) >= 2, "multi-stage: build tools stay out of the final image"
    final = steps[stages[-1] :]
    assert final[0][1].split()[0] == "${PYTHON_IMAGE}"
    assert dict(steps[: stages[0]])["ARG"].startswith("PYTHON_IMAGE=python:3.11-slim")
    (user,) = [args for keyword, args in final if keyword == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    (entrypoint,) = [args for keyword, args in final if keyword == "ENTRYPOINT"]
    assert entrypoint == '["/usr/bin/tini", "--", "python", "-m"]'
    build = " ".join(args for keyword, args in steps[: stages[-1]] if keyword in ("COPY", "RUN"))
    assert "requirements/main.lock" in build and "--no-deps /src" in build


def test_build_context_holds_every_installed_package() -> None:
    allowed = [
        line[1:].strip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    for pattern in find["include"]:
        name = pattern.rstrip("*")
        homes = [f"{where}/{name}".removeprefix("./") for where in find["where"]]
        (home,) = [h for h in homes if (ROOT / h).is_dir()]
        assert any(home == a or home.startswith(a + "/") for a in allowed), home
    for needed in ("pyproject.toml", "README.md", "requirements/main.lock"):
        assert needed in allowed
