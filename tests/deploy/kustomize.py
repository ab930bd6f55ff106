"""Rendering the kustomize variants (deploy/k8s) and reading what they contain, for the tests."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import pytest
import yaml

from tests.deploy.support import DEPLOY, resolve_env, run

Doc: TypeAlias = dict[str, Any]

K8S = DEPLOY / "k8s"
KUBECTL = shutil.which("kubectl")
# 1.30: the first with securityContext.appArmorProfile; 1.37: the newest kubernetes-validate has.
K8S_VERSIONS = ("1.30", "1.37")
# overlay, components added on top of it
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "dev": ("overlays/dev", ()),
    "prod": ("overlays/prod", ()),
    "prod+user-namespaces": ("overlays/prod", ("components/runtime-user-namespaces",)),
    "prod+restricted": ("overlays/prod", ("components/runtime-restricted",)),
    "prod+runtime-mtls": ("overlays/prod", ("components/runtime-mtls",)),
    "ha": ("overlays/ha", ()),
    "ha-external-postgres": ("overlays/ha-external-postgres", ()),
    "ha+runtime-mtls": ("overlays/ha", ("components/runtime-mtls",)),
}
# The variants with several registry replicas on a shared PostgreSQL.
HA_VARIANTS = [name for name in VARIANTS if name.startswith("ha")]
# What the downward API gives a pod (`fieldRef`), as the tests stand it in.
FIELDS = {"metadata.name": "pod-0", "status.podIP": "10.0.0.7"}

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: `kubectl kustomize` renders the overlays"
)


def rendered(variant: str) -> str:
    return render(*VARIANTS[variant])


@functools.cache
def render(overlay: str, components: tuple[str, ...] = ()) -> str:
    """`kubectl kustomize` of `overlay` with `components` added (paths below deploy/k8s)."""
    assert KUBECTL is not None
    if not components:
        result = run([KUBECTL, "kustomize", str(K8S / overlay)])
    else:
        # Components are opted into by a kustomization of the user's own; kustomize accepts
        # only relative paths to other roots: write one in a scratch directory pointing back here.
        with tempfile.TemporaryDirectory() as scratch:
            back = os.path.relpath(K8S, scratch)
            kustomization = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{back}/{overlay}"],
                "components": [f"{back}/{component}" for component in components],
            }
            (Path(scratch) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            result = run([KUBECTL, "kustomize", scratch])
    assert result.returncode == 0, result.stderr
    return result.stdout


def docs(variant: str) -> list[Doc]:
    return parse(rendered(variant))


def parse(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(resources: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [
        doc
        for doc in resources
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]


def one(resources: list[Doc], kind: str, name: str) -> Doc:
    found = find(resources, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_labels(resources: list[Doc], workload: str, kind: str = "Deployment") -> dict[str, str]:
    labels: dict[str, str] = one(resources, kind, workload)["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in selector, "matchExpressions are not checked here"
    match: dict[str, str] = selector.get("matchLabels", {})
    return all(labels.get(key) == value for key, value in match.items())


def containers(deployment: Doc) -> list[Doc]:
    spec = deployment["spec"]["template"]["spec"]
    found: list[Doc] = spec["containers"] + spec.get("initContainers", [])
    return found


def effective(deployment: Doc, container: Doc, key: str) -> Any:
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    pod = deployment["spec"]["template"]["spec"].get("securityContext", {})
    return container.get("securityContext", {}).get(key, pod.get(key))


def secret_files_in(
    directory: Path, deployment: Doc, container: Doc, env: dict[str, str]
) -> dict[str, str]:
    """`env` with paths into mounted Secrets moved to stand-in PEM files under `directory`
    (the settings read them at load; their content is the cluster's)."""
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    secret_volumes = {v["name"] for v in volumes if "secret" in v}
    mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in secret_volumes]
    moved = dict(env)
    for key, value in env.items():
        for mount in mounts:
            if value.startswith(mount + "/"):
                stand_in = directory / value.removeprefix(mount + "/")
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.write_text("-----BEGIN STAND-IN-----\n")
                moved[key] = str(stand_in)
    return moved


@dataclass(frozen=True)
class PodStart:
    """What one workload's container starts with: its resolved env and its settings file."""

    workload: Doc
    container: Doc
    env: dict[str, str]
    """As the kubelet resolves it (Secret keys: their stand-ins)."""
    settings_file: Path | None
    """The ConfigMap file its `--config` names, written out; None: no `--config`."""


def pod_start(
    resources: list[Doc], name: str, directory: Path, kind: str = "Deployment"
) -> PodStart:
    """The single container of workload `name`, its settings file written under `directory`."""
    workload = one(resources, kind, name)
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    namespace = workload["metadata"]["namespace"]
    env = resolve_env(container.get("env", []), {**FIELDS, "metadata.namespace": namespace})
    args: list[str] = container.get("args", [])
    if "--config" not in args:
        return PodStart(workload, container, env, None)
    config = Path(args[args.index("--config") + 1])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    data = one(resources, "ConfigMap", volume["configMap"]["name"])["data"]
    directory.mkdir(parents=True, exist_ok=True)
    settings_file = directory / config.name
    settings_file.write_text(data[config.name])
    return PodStart(workload, container, env, settings_file)
