"""`@codemode/client` is ready to publish: not private, Apache-2.0 with its LICENSE, types and
`exports` for `.` and `./testing`, a build on `prepack`, and a tarball of exactly the built
client (no sources, tests or generated-code inputs). Packing writes no tarball into the tree.

(tests/examples/test_examples.py installs the packed tarball into a fresh npm project and
compiles and runs the TypeScript example and an import of `@codemode/client/testing` there.
Both pack this run's one build, tests/typescript_build.py: with `prepack` running it, two
workers' packs would rebuild dist/ under each other.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.typescript_build import PACKAGE, built_client

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (Node 20)")


def test_the_package_json_is_publishable() -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert "private" not in manifest
    assert manifest["license"] == "Apache-2.0"
    assert manifest["scripts"]["prepack"] == "npm run build"
    assert manifest["types"] == "dist/src/index.d.ts" and manifest["main"] == "dist/src/index.js"
    exports = manifest["exports"]
    assert exports["."] == {"types": "./dist/src/index.d.ts", "default": "./dist/src/index.js"}
    assert exports["./testing"] == {
        "types": "./dist/src/testing.d.ts",
        "default": "./dist/src/testing.js",
    }
    assert set(manifest["files"]) == {"dist/src", "README.md", "LICENSE"}


# Not a bound on time: tsc and npm over the client take minutes on a loaded shared host; each
# child has its own timeout.
@pytest.mark.timeout(600)
def test_npm_pack_ships_the_built_client_and_leaves_no_tarball(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    built_client(pytestconfig)  # what `prepack` runs (asserted above), once per run
    before = set(PACKAGE.rglob("*.tgz"))
    done = subprocess.run(
        ["npm", "pack", "--dry-run", "--ignore-scripts", "--json", "--pack-destination",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=PACKAGE, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    files = {entry["path"] for entry in report["files"]}
    assert {"LICENSE", "README.md", "package.json"} <= files
    for module in ("index", "testing", "provider", "registry"):
        assert {f"dist/src/{module}.js", f"dist/src/{module}.d.ts"} <= files
    assert "dist/src/service_config.json" in files  # read at run time by the retry policy
    strays = sorted(f for f in files if not f.startswith("dist/src/") and "/" in f)
    assert strays == [], strays  # no src/, test/, scripts/ or dist/test/
    assert not any(f.endswith(".ts") and not f.endswith(".d.ts") for f in files)
    assert set(PACKAGE.rglob("*.tgz")) == before
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing anywhere
