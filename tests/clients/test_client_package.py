"""The Python client installs on its own: its wheel, built from clients/python, in a fresh venv
that holds only the wheel and its declared dependencies (not the servers' package), imports every
public module and drives live services: a typed tool served from that venv, called by a program.
The wheel carries full metadata (license and its file, readme, urls, classifiers, the Python it
needs), and its `testing` extra adds the pytest plugin: in the same venv, with the extra's
packages added, a user's test file runs against services its fixtures start.

No network: the wheel is built without build isolation, and the declared dependencies are copied
from this environment's installed distributions (their files, as their RECORD lists them)."""

from __future__ import annotations

import asyncio
import email.message
import email.parser
import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from codemode_client.testing.services import COMMAND_VARIABLE
from tests.codemode.conftest import Stack

CLIENT_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "python"

SCRIPT = """
import asyncio, importlib, json, pkgutil, sys
from typing_extensions import TypedDict  # pydantic wants it on 3.11

import codemode_client, codemode_wire
from codemode_wire import host_facade  # its JSON is package data
from codemode_client import RegistryClient, ToolProvider, open_channel

modules, missing = [], {}
for package in (codemode_client, codemode_wire):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(info.name)
            modules.append(info.name)
        except ModuleNotFoundError as exc:  # an optional extra's module
            missing[info.name] = exc.name
plugin = missing.get("codemode_client.testing.plugin", "imported")
from codemode_client.model_sdks import AgentTools, openai_chat  # no vendor SDK needed

servers = []
for name in ("codemode_common", "registry_service", "runtime_service", "codemode_cli"):
    try:
        importlib.import_module(name)
        servers.append(name)
    except ImportError:
        pass

class Args(TypedDict):
    word: str
    times: int

async def main(address: str) -> dict:
    provider = ToolProvider(open_channel(address), "packaged")

    @provider.tool(concurrency_safe=True)
    async def repeat(args: Args, ctx: object) -> str:
        \"\"\"Repeat a word.\"\"\"
        return args["word"] * args["times"]

    async with provider, RegistryClient(address) as client:
        agent = await client.create_agent("packaged", mode="code")
        program = "print('calling')\\nreturn await tools.repeat({'word': 'ab', 'times': 3})"
        result = await client.run_code(program, "repeat a word", agent=agent.name)
        tools = {t.name: t for t in await client.list_tools()}
        agent_tools = await AgentTools.load(client, agent.name)
        chat_tools = openai_chat.tool_definitions(agent_tools.schemas)
    return {
        "missing": missing, "chat_tools": [t["function"]["name"] for t in chat_tools],
        "value": result.value, "text": result.text,
        "schema": json.loads(tools["repeat"].input_schema_json),
        "modules": modules, "servers": servers, "executable": sys.executable,
        "facade": host_facade.load().version, "plugin": plugin,
    }

print(json.dumps(asyncio.run(main(sys.argv[1]))))
"""


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _copy_distribution(name: str, into: Path, done: set[str]) -> None:
    """Copies installed distribution `name` and, transitively, what it requires (for this
    interpreter, no extras) from this environment into the site-packages `into`."""
    dist = metadata.distribution(name)
    key = dist.metadata["Name"].lower().replace("_", "-")
    if key in done:
        return
    done.add(key)
    here = Path(sysconfig.get_paths()["purelib"])
    for file in dist.files or ():
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue  # console scripts, caches
        source = here / file
        target = into / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for spec in dist.requires or ():
        requirement = Requirement(spec)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            _copy_distribution(requirement.name, into, done)


def _requirements(venv: Path, extra: str) -> list[Requirement]:
    """The installed client's requirements that apply with `extra` ("" for none)."""
    declared = metadata.PathDistribution(
        next(_site_packages(venv).glob("codemode_client-*.dist-info"))
    ).requires
    assert declared is not None
    applying = []
    for spec in declared:
        requirement = Requirement(spec)
        marker = requirement.marker
        if (marker is None) == (extra == "") and (
            marker is None or marker.evaluate({"extra": extra})
        ):
            applying.append(requirement)
    return applying


def _add_requirements(python: Path, venv: Path, extra: str, copied: set[str]) -> None:
    for requirement in _requirements(venv, extra):
        _copy_distribution(requirement.name, _site_packages(venv), copied)
    assert "codemode" not in copied
    # Every declared dependency (and theirs) is there, at versions that satisfy them.
    subprocess.run([*PIP, "--python", python, "check"], check=True)


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(
        CLIENT_SOURCE,
        source,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, source],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("codemode_client-*.whl")
    return wheel


def _install_client(tmp_path: Path, wheel: Path, copied: set[str]) -> Path:
    """A fresh venv holding the client's wheel and its declared dependencies: its python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel], check=True
    )
    _add_requirements(python, venv, "", copied)
    declared = metadata.PathDistribution(
        next(_site_packages(venv).glob("codemode_client-*.dist-info"))
    ).requires
    assert declared is not None
    # The extras (model SDKs) are declared but not part of the base install.
    assert {"openai", "anthropic", "pydantic-ai-slim"} <= {Requirement(r).name for r in declared}
    assert not copied & {"openai", "anthropic", "pydantic-ai-slim"}
    return python


def _wheel_metadata(wheel: Path) -> tuple[email.message.Message, dict[str, str]]:
    """The wheel's METADATA and its other dist-info files' text, by name."""
    with zipfile.ZipFile(wheel) as archive:
        info = {
            name.split(".dist-info/", 1)[1]: archive.read(name).decode()
            for name in archive.namelist()
            if ".dist-info/" in name
        }
    return email.parser.Parser().parsestr(info["METADATA"]), info


def test_the_wheel_has_full_metadata(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    meta, info = _wheel_metadata(wheel)
    root = tomllib.loads((CLIENT_SOURCE.parents[1] / "pyproject.toml").read_text())["project"]
    assert meta["Name"] == "codemode-client" and meta["Version"] == root["version"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert info["licenses/LICENSE"] == (CLIENT_SOURCE.parents[1] / "LICENSE").read_text()
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "pip install" in meta.get_payload() and ".whl" in meta.get_payload()  # the README
    urls = dict(url.split(", ", 1) for url in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source"} <= set(urls)
    classifiers = set(meta.get_all("Classifier") or [])
    assert {"Programming Language :: Python :: 3.11", "Typing :: Typed"} <= classifiers
    assert "Framework :: Pytest" in classifiers
    extras = ["testing", "openai", "anthropic", "pydantic-ai"]
    assert sorted(meta.get_all("Provides-Extra") or []) == sorted(extras)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    base = {r.name for r in requires if r.marker is None}
    assert {"grpcio", "protobuf", "pydantic"} <= base and "pytest" not in base
    by_extra = {
        extra: {r.name for r in requires if r.marker and r.marker.evaluate({"extra": extra})}
        for extra in extras
    }
    assert by_extra == {
        "testing": {"pytest", "pytest-asyncio"},
        "openai": {"openai"},
        "anthropic": {"anthropic"},
        "pydantic-ai": {"pydantic-ai-slim"},
    }
    assert all(r.specifier for r in requires)  # every dependency has a compatible range
    entry_points = info["entry_points.txt"]
    assert "[pytest11]" in entry_points
    assert "codemode = codemode_client.testing.plugin" in entry_points


USER_TEST = """
from typing import Any

import pytest
from typing_extensions import TypedDict

from codemode_client.testing import RunCode, expect


class Args(TypedDict):
    word: str


@pytest.mark.asyncio
async def test_shout(codemode: Any) -> None:
    tools = codemode.provider("words")

    @tools.tool(concurrency_safe=True)
    async def shout(args: Args, ctx: Any) -> str:
        return args["word"].upper()

    await tools.start()
    agent = await codemode.agent()
    conversation = await codemode.play(agent, RunCode("return await tools.shout({'word': 'hi'})"))
    assert conversation.last.result.value == {"logs": [], "result": "HI"}
    trajectory = await codemode.trajectory(agent, conversation.last.call_id)
    trajectory.assert_nested(expect("shout", {"word": "hi"}, result="HI"))
"""


async def test_the_client_wheel_works_alone_against_live_services(
    tmp_path: Path, stack: Stack
) -> None:
    # In threads: the live registry serves from this test's event loop.
    wheel = await asyncio.to_thread(_build_wheel, tmp_path)
    copied: set[str] = set()
    python = await asyncio.to_thread(_install_client, tmp_path, wheel, copied)
    script = tmp_path / "use_the_client.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = await asyncio.to_thread(
        functools.partial(
            subprocess.run,
            [str(python), str(script), stack.running.address],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["executable"] == str(python)
    assert report["servers"] == []  # the servers' packages are not importable there
    assert {"codemode_client.client", "codemode_wire.api.registry.v1.tool_pb2"} <= set(
        report["modules"]
    )
    assert report["facade"] >= 1  # host_facade.json ships in the wheel
    assert report["plugin"] == "pytest"  # only the testing extra's plugin needs pytest
    # The base client needs no model SDK: only the pydantic-ai toolset needs its extra.
    assert report["missing"] == {
        "codemode_client.testing.plugin": "pytest",
        "codemode_client.model_sdks.pydantic_ai_toolset": "pydantic_ai",
    }
    assert "codemode_client.model_sdks.openai_responses" in report["modules"]
    assert report["chat_tools"] == ["run_code"]
    assert report["value"] == {"logs": ["calling"], "result": "ababab"}
    assert report["text"] == "calling\nababab"
    assert report["schema"]["required"] == ["word", "times"]  # derived by pydantic there

    # The testing extra: its packages added, pytest finds the plugin by its entry point and a
    # user's test runs against services it starts with this checkout's `codemode` command.
    venv = python.parent.parent
    await asyncio.to_thread(_add_requirements, python, venv, "testing", copied)
    assert {"pytest", "pytest-asyncio"} <= copied
    (tmp_path / "user" / "tests").mkdir(parents=True)
    (tmp_path / "user" / "tests" / "test_words.py").write_text(textwrap.dedent(USER_TEST))
    env[COMMAND_VARIABLE] = f"{sys.executable} -m codemode_cli"
    ran = await asyncio.to_thread(
        functools.partial(
            subprocess.run,
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=tmp_path / "user",
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout
