"""Kustomize overlays (deploy/k8s): schema-valid for Kubernetes, hardened, balanced, scalable.

Each variant is rendered with `kubectl kustomize` and checked offline: `kubernetes-validate
--strict` against the oldest and newest Kubernetes versions the manifests target, then the
properties that matter and that a schema cannot see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from registry_service.config import RegistrySettings
from tests.deploy.kustomize import (
    FIELDS,
    HA_VARIANTS,
    K8S_VERSIONS,
    VARIANTS,
    containers,
    docs,
    effective,
    find,
    needs_kubectl,
    one,
    pod_labels,
    pod_start,
    rendered,
    secret_files_in,
    selects,
)
from tests.deploy.support import load_service_settings, resolve_env, run, tool

# What the runtime's worker sandbox needs (deploy/README.md, "Runtime pod security").
SANDBOX_CAPABILITIES = {"SYS_ADMIN", "SETUID", "SETGID", "KILL", "SYS_CHROOT", "SYS_NICE"}

pytestmark = needs_kubectl


variants = pytest.mark.parametrize("variant", list(VARIANTS))


@variants
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validate_strict(variant: str, version: str) -> None:
    result = run([tool("kubernetes-validate"), "--strict", "-k", version, "-"], rendered(variant))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed for resource deployment/runtime" in result.stdout


def test_strict_validation_rejects_unknown_fields() -> None:
    resources = docs("dev")
    runtime = one(resources, "Deployment", "runtime")
    runtime["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnly"] = True
    text = yaml.safe_dump_all(resources)
    result = run([tool("kubernetes-validate"), "--strict", "-k", K8S_VERSIONS[0], "-"], text)
    assert result.returncode != 0
    assert "readOnly" in result.stdout + result.stderr


@variants
def test_containers_are_hardened(variant: str) -> None:
    resources = docs(variant)
    assert {d["metadata"]["name"] for d in find(resources, "Deployment")} == {
        "registry",
        "runtime",
    }
    workloads = find(resources, "Deployment") + find(resources, "StatefulSet")
    for deployment in workloads:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == deployment["metadata"]["name"]
        one(resources, "ServiceAccount", pod["serviceAccountName"])
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in containers(deployment):
            where = f"{variant}: {deployment['metadata']['name']}/{container['name']}"
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context.get("privileged") is not True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert effective(deployment, container, "seccompProfile") == {
                "type": "RuntimeDefault"
            }, where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), where
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], where


@variants
def test_only_the_sandboxed_runtime_runs_as_root(variant: str) -> None:
    resources = docs(variant)
    for workload in [one(resources, "Deployment", "registry"), *find(resources, "StatefulSet")]:
        for container in containers(workload):
            assert effective(workload, container, "runAsNonRoot") is True
            assert effective(workload, container, "runAsUser") not in (None, 0)
            assert "add" not in container["securityContext"]["capabilities"]
    runtime = one(resources, "Deployment", "runtime")
    (container,) = containers(runtime)
    context = container["securityContext"]
    if variant.endswith("+restricted"):
        assert effective(runtime, container, "runAsNonRoot") is True
        assert effective(runtime, container, "runAsUser") not in (None, 0)
        assert "add" not in context["capabilities"]
        assert "appArmorProfile" not in context
    else:
        # Kubernetes grants added capabilities only to uid 0; exactly the sandbox's set.
        assert context["runAsUser"] == 0
        assert context["runAsNonRoot"] is False
        assert set(context["capabilities"]["add"]) == SANDBOX_CAPABILITIES
    host_users = runtime["spec"]["template"]["spec"].get("hostUsers", True)
    assert host_users is (not variant.endswith("+user-namespaces"))
    enforce = one(resources, "Namespace", runtime["metadata"]["namespace"])["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"
    ]
    assert enforce == ("restricted" if variant.endswith("+restricted") else "privileged")


@variants
def test_probes_are_native_grpc(variant: str) -> None:
    for deployment in find(docs(variant), "Deployment"):
        for container in containers(deployment):
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            # A port requiring mutual TLS is probed on its plaintext health-only port.
            port = ports.get("health", ports["grpc"])
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container[kind]
                assert probe["grpc"] == {"port": port}, f"{container['name']} {kind}"
                assert not {"httpGet", "tcpSocket", "exec"} & set(probe)


@variants
def test_runtime_service_is_headless(variant: str) -> None:
    resources = docs(variant)
    runtime = one(resources, "Service", "runtime")["spec"]
    assert runtime["clusterIP"] == "None"
    assert runtime["ports"] == [
        {
            "name": "grpc",
            "port": 50052,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2" if variant.endswith("mtls") else "kubernetes.io/h2c",
        }
    ]
    assert selects({"matchLabels": runtime["selector"]}, pod_labels(resources, "runtime"))
    assert not selects({"matchLabels": runtime["selector"]}, pod_labels(resources, "registry"))
    registry = one(resources, "Service", "registry")["spec"]
    assert registry.get("clusterIP") != "None"
    assert selects({"matchLabels": registry["selector"]}, pod_labels(resources, "registry"))


@variants
def test_settings_and_env_load_as_the_services_would(
    variant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    resources = docs(variant)
    for deployment in find(resources, "Deployment"):
        name = deployment["metadata"]["name"]
        start = pod_start(resources, name, tmp_path / name)
        container, settings_file = start.container, start.settings_file
        assert container["args"][:2] == [f"{name}_service", "--config"]
        env = secret_files_in(tmp_path / name / "secrets", deployment, container, start.env)
        prefix = f"CODEMODE_{name.upper()}_"
        settings = load_service_settings(monkeypatch, prefix, env, settings_file)
        assert settings.listen.startswith("0.0.0.0:")
        assert env["OTEL_SERVICE_NAME"] == f"codemode-{name}"
        trace_file = env[f"{prefix}TRACE_FILE"]
        if variant != "dev":
            assert trace_file != "off"
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4317")
            assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
        else:
            assert trace_file == "off", "a span file on a read-only root cannot be opened"
        if isinstance(settings, RegistrySettings):
            targets = settings.runtime_targets
            assert targets == [
                f"dns:///runtime.{deployment['metadata']['namespace']}.svc.cluster.local:50052"
            ]
            assert env["CODEMODE_REGISTRY_RUNTIME_KEEPALIVE_S"] == "30"
            shared = variant in HA_VARIANTS
            assert settings.history_store == ("postgres" if shared else "sqlite")
        else:
            age = int(env["CODEMODE_RUNTIME_MAX_CONNECTION_AGE_S"])
            grace = int(env["CODEMODE_RUNTIME_MAX_CONNECTION_AGE_GRACE_S"])
            # The grace must outlast the longest run the runtime accepts.
            assert 0 < age < grace and grace * 1000 > settings.max_wall_ms
            # A cgroup per run below the container's: the read-only cgroup2 mount is remounted
            # read-write, which needs SYS_ADMIN (absent only where the sandbox is traded away).
            assert settings.cgroups == "auto" and settings.cgroup_remount is True
            added = container["securityContext"]["capabilities"].get("add", [])
            assert ("SYS_ADMIN" in added) == (variant != "prod+restricted")
        termination = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert settings.shutdown_grace_s < termination


def test_runtime_mtls_admits_only_the_registry_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    resources = docs("prod+runtime-mtls")
    loaded: dict[str, Any] = {}
    for name in ("runtime", "registry"):
        deployment = one(resources, "Deployment", name)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = resolve_env(container["env"], {**FIELDS, "metadata.namespace": "codemode"})
        env = secret_files_in(tmp_path / name, deployment, container, env)
        prefix = f"CODEMODE_{name.upper()}_"
        loaded[name] = load_service_settings(monkeypatch, prefix, env, None)
        loaded[f"{name}-container"] = container
    runtime, registry = loaded["runtime"], loaded["registry"]
    # Run/Host only from the registry's certificate identity, verified against the CA.
    assert runtime.registry_identities == ["cert:spiffe://codemode/registry"]
    assert runtime.server_tls() is not None and runtime.tls_client_ca_file is not None
    # The registry presents a client certificate and checks the runtime's.
    tls = registry.runtime_tls()
    assert tls is not None and tls.certificate_chain is not None
    # Probes reach the plaintext health-only port the runtime serves.
    health = runtime.health_listen.rsplit(":", 1)[1]
    ports = {p["name"]: p["containerPort"] for p in loaded["runtime-container"]["ports"]}
    assert str(ports["health"]) == health


@variants
def test_network_policy_admits_only_registry_to_runtime(variant: str) -> None:
    resources = docs(variant)
    runtime, registry = pod_labels(resources, "runtime"), pod_labels(resources, "registry")
    policies = find(resources, "NetworkPolicy")
    ingress = [
        p["spec"]
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], runtime)
    ]
    assert any(not spec.get("ingress") for spec in ingress), "no default-deny for runtime ingress"
    rules = [rule for spec in ingress for rule in spec.get("ingress", [])]
    assert rules
    for rule in rules:
        assert rule.get("from"), "a rule without `from` admits every source"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, "only same-namespace registry pods"
            assert peer["podSelector"].get("matchLabels"), "an empty selector admits every pod"
            assert selects(peer["podSelector"], registry)
            assert not selects(peer["podSelector"], runtime)
        assert rule["ports"] == [{"protocol": "TCP", "port": 50052}]
    for policy in policies:  # clients must still reach the registry
        assert not selects(policy["spec"]["podSelector"], registry)


@variants
def test_autoscaling_and_disruption_budget_target_runtime(variant: str) -> None:
    resources = docs(variant)
    runtime_labels = pod_labels(resources, "runtime")
    runtime = one(resources, "Deployment", "runtime")["spec"]
    autoscalers = find(resources, "HorizontalPodAutoscaler")
    if variant == "dev":
        assert not autoscalers
        assert runtime["replicas"] == 1
    else:
        (hpa,) = autoscalers
        assert hpa["apiVersion"] == "autoscaling/v2"
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "runtime",
        }
        assert any(
            m["type"] == "Resource"
            and m["resource"]["name"] == "cpu"
            and m["resource"]["target"]["type"] == "Utilization"
            for m in spec["metrics"]
        )
        assert 3 <= spec["minReplicas"] <= spec["maxReplicas"]
        assert "replicas" not in runtime, "the HPA owns the replica count"
    pdb = one(resources, "PodDisruptionBudget", "runtime")
    assert selects(pdb["spec"]["selector"], runtime_labels)
    assert not selects(pdb["spec"]["selector"], pod_labels(resources, "registry"))
    # maxUnavailable never blocks a node drain, whatever the replica count.
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in HA_VARIANTS])
def test_registry_history_storage(variant: str) -> None:
    """One registry with its SQLite history (test_registry_ha.py: the shared PostgreSQL)."""
    resources = docs(variant)
    registry = one(resources, "Deployment", "registry")
    assert registry["spec"]["replicas"] == 1
    assert registry["spec"]["strategy"] == {"type": "Recreate"}, "one SQLite writer at a time"
    pod = registry["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = resolve_env(container["env"], {**FIELDS, "metadata.namespace": "ns"})
    history_dir = str(Path(env["CODEMODE_REGISTRY_HISTORY_PATH"]).parent)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == history_dir]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    if variant == "dev":
        assert set(volume) == {"name", "emptyDir"}
    else:
        assert set(volume) == {"name", "persistentVolumeClaim"}
        claim = one(
            resources, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
        )
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pod["securityContext"]["fsGroup"] == container["securityContext"]["runAsGroup"]
