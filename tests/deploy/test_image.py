"""The container image definition: lint-clean, built from the locks, non-root by default, and a
build context that holds every package the project installs (there is no Docker engine here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

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
    args = [value for keyword, value in steps[: stages[0]] if keyword == "ARG"]
    assert any(arg.startswith("PYTHON_IMAGE=python:3.11-slim") for arg in args), args
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
        # clients/python/codemode_wire is the client wheel's link to the top-level package
        (home,) = [h for h in homes if (ROOT / h).is_dir() and not (ROOT / h).is_symlink()]
        assert any(home == a or home.startswith(a + "/") for a in allowed), home
    for needed in ("pyproject.toml", "README.md", "LICENSE", "requirements/main.lock"):
        assert needed in allowed


def test_the_runtime_image_ships_node_and_the_typescript_worker() -> None:
    """Node 20 and the worker's locked node_modules reach the final image, beside the
    installed worker.js, and the image checks that the runtime would serve TypeScript."""
    steps = instructions()
    stages = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    args = [value for keyword, value in steps[: stages[0]] if keyword == "ARG"]
    assert any(arg.startswith("NODE_IMAGE=node:20.") for arg in args), args
    (node_stage,) = [i for i in stages if steps[i][1] == "${NODE_IMAGE} AS worker-ts"]
    following = [i for i in stages if i > node_stage]
    node_steps = steps[node_stage : following[0] if following else None]
    runs = [value for keyword, value in node_steps if keyword == "RUN"]
    assert any(r.startswith("npm ci") and "--omit=dev" in r for r in runs), runs
    copies = [value for keyword, value in node_steps if keyword == "COPY"]
    assert any("runtime_service/worker_ts/package-lock.json" in c for c in copies), copies
    later = [value for keyword, value in steps[node_stage + 1 :] if keyword in ("COPY", "RUN")]
    assert "--from=worker-ts /worker_ts/node_modules /tmp/worker_ts_modules" in later
    final = steps[stages[-1] :]
    final_text = " ".join(value for keyword, value in final if keyword in ("COPY", "RUN"))
    assert "--from=worker-ts /usr/local/bin/node /usr/local/bin/node" in final_text
    assert "sys.exit(typescript.BACKEND.unavailable(WorkerSpec()))" in final_text
    assert "sys.exit(monty.BACKEND.unavailable(WorkerSpec()))" in final_text
    # The image installs main.lock: Monty's client package and the one holding its binary.
    locked = (ROOT / "requirements" / "main.lock").read_text().splitlines()
    assert {"pydantic-monty-client", "pydantic-monty-runtime"} <= {
        line.partition("==")[0] for line in locked
    }
    assert "libstdc++6" in final_text  # the one library Node needs beyond libc
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**/node_modules" in ignored  # installed from the lock, never from a checkout


def test_the_wheel_holds_the_typescript_workers_code(tmp_path: Path) -> None:
    """What `pip install /src` puts in the image: every module of the worker (an offline
    build of the image's build context: a checkout's own build/ could hold stale files)."""
    context = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # the metadata names the LICENSE
        context.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, context / name)
    skip = shutil.ignore_patterns("node_modules", "__pycache__", "*.egg-info", "build", "tests")
    for package in ("codemode_common", "registry_service", "runtime_service", "codemode_cli"):
        shutil.copytree(ROOT / package, context / package, ignore=skip)
    shutil.copytree(ROOT / "clients" / "python", context / "clients" / "python", ignore=skip)
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(wheels), str(context)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    worker = ROOT / "runtime_service" / "worker_ts"
    needed = [p.name for p in worker.glob("*.js")] + ["package.json", "package-lock.json"]
    assert "worker.js" in needed
    missing = [name for name in needed if f"runtime_service/worker_ts/{name}" not in names]
    assert missing == [], missing
    # The Monty bridge, exec'd from the installed package (runtime_service/languages/monty.py).
    assert "runtime_service/worker_monty/bridge.py" in names
