"""Several registry replicas on one PostgreSQL (deploy/k8s: components/registry-ha with
components/postgres or components/postgres-external; overlays/ha, overlays/ha-external-postgres).

Rendered and checked offline, as test_manifests.py does for every variant (which also runs
`kubernetes-validate --strict` over these): the replicas, their disruption budget and spread,
the headless Service the clients' ReplicaSet resolves, the store and its DSN loaded as the
registry would load them, and that no password or key is ever written into a manifest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from codemode_client.replicas import split_target
from registry_service.config import ConfigError, RegistrySettings
from tests.deploy.kustomize import (
    FIELDS,
    HA_VARIANTS,
    K8S_VERSIONS,
    Doc,
    containers,
    docs,
    find,
    needs_kubectl,
    one,
    parse,
    pod_labels,
    pod_start,
    render,
    rendered,
    secret_files_in,
    selects,
)
from tests.deploy.support import load_service_settings, resolve_env, run, tool

pytestmark = needs_kubectl

ha_variants = pytest.mark.parametrize("variant", HA_VARIANTS)
# Variants running PostgreSQL in the namespace (the others use an external DSN).
IN_CLUSTER = [v for v in HA_VARIANTS if "external" not in v]
NAMESPACE = "codemode"
# The official image at an exact release (`17.6`, `17.9-bookworm`), optionally with its digest.
PINNED_POSTGRES = re.compile(r"postgres:\d+\.\d+(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?")
# Env names that carry a credential: each must come from a Secret, never a literal value.
CREDENTIAL = re.compile(r"PASSWORD$|TOKEN_KEY$|_DSN$")
URI_PASSWORD = re.compile(r"postgres(ql)?://[^/\s:@]+:[^@\s]+@")


def registry_env(resources: list[Doc]) -> tuple[list[Doc], dict[str, str]]:
    """The registry container's env entries, and their values as the kubelet resolves them."""
    (container,) = one(resources, "Deployment", "registry")["spec"]["template"]["spec"][
        "containers"
    ]
    entries: list[Doc] = container["env"]
    return entries, resolve_env(entries, {**FIELDS, "metadata.namespace": NAMESPACE})


def secret_ref(entries: list[Doc], name: str) -> tuple[str, str] | None:
    (entry,) = [e for e in entries if e["name"] == name]
    ref = entry.get("valueFrom", {}).get("secretKeyRef")
    return None if ref is None else (ref["name"], ref["key"])


def load_registry(
    resources: list[Doc], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> RegistrySettings:
    """The registry's settings from exactly its rendered settings file and env."""
    start = pod_start(resources, "registry", tmp_path)
    env = secret_files_in(tmp_path / "secrets", start.workload, start.container, start.env)
    settings = load_service_settings(monkeypatch, "CODEMODE_REGISTRY_", env, start.settings_file)
    assert isinstance(settings, RegistrySettings)
    return settings


@ha_variants
def test_registry_runs_several_replicas_rolled_one_at_a_time(variant: str) -> None:
    registry = one(docs(variant), "Deployment", "registry")["spec"]
    assert registry["replicas"] >= 2
    # A rollout starts a new replica before it stops an old one: never fewer than `replicas`.
    assert registry["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


@ha_variants
def test_registry_replicas_spread_over_nodes_and_zones(variant: str) -> None:
    resources = docs(variant)
    labels = pod_labels(resources, "registry")
    pod = one(resources, "Deployment", "registry")["spec"]["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert selects(constraint["labelSelector"], labels)
        assert not selects(constraint["labelSelector"], pod_labels(resources, "runtime"))
        # A preference: a one-node cluster still runs every replica.
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"], labels)


@ha_variants
def test_a_database_outage_does_not_restart_every_registry(variant: str) -> None:
    """Every replica's health is NOT_SERVING while PostgreSQL is away: readiness reacts,
    liveness outlasts a database restart (a restarted registry cannot start without it)."""
    (container,) = one(docs(variant), "Deployment", "registry")["spec"]["template"]["spec"][
        "containers"
    ]
    ready, live = container["readinessProbe"], container["livenessProbe"]

    def tolerated_s(probe: Doc) -> int:
        return int(probe["periodSeconds"]) * int(probe["failureThreshold"])

    assert tolerated_s(live) >= 180 > tolerated_s(ready)


@ha_variants
def test_disruption_budget_keeps_registries_serving(variant: str) -> None:
    resources = docs(variant)
    pdb = one(resources, "PodDisruptionBudget", "registry")["spec"]
    assert selects(pdb["selector"], pod_labels(resources, "registry"))
    assert not selects(pdb["selector"], pod_labels(resources, "runtime"))
    for statefulset in find(resources, "StatefulSet"):
        labels = pod_labels(resources, statefulset["metadata"]["name"], "StatefulSet")
        assert not selects(pdb["selector"], labels)
    # One at a time, never blocking a drain, and always fewer than there are replicas.
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
    assert pdb["maxUnavailable"] < one(resources, "Deployment", "registry")["spec"]["replicas"]
    # Exactly the two budgets: registry and runtime (one pod's PostgreSQL gets none, as a
    # budget of zero would block every drain of its node).
    assert {p["metadata"]["name"] for p in find(resources, "PodDisruptionBudget")} == {
        "registry",
        "runtime",
    }


@ha_variants
def test_headless_service_resolves_every_registry_replica(variant: str) -> None:
    resources = docs(variant)
    labels = pod_labels(resources, "registry")
    replicas = one(resources, "Service", "registry-replicas")
    spec = replicas["spec"]
    assert spec["clusterIP"] == "None", "a ClusterIP would give a ReplicaSet one replica"
    assert spec.get("publishNotReadyAddresses", False) is False
    assert selects({"matchLabels": spec["selector"]}, labels)
    assert not selects({"matchLabels": spec["selector"]}, pod_labels(resources, "runtime"))
    (port,) = spec["ports"]
    (container,) = one(resources, "Deployment", "registry")["spec"]["template"]["spec"][
        "containers"
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["targetPort"] == "grpc" and port["port"] == ports["grpc"]
    # The name a provider or approver gives its ReplicaSet (deploy/README.md).
    name = f"{replicas['metadata']['name']}.{replicas['metadata']['namespace']}.svc.cluster.local"
    assert split_target(f"{name}:{port['port']}") == (name, 50051)
    # Model-facing clients keep one balanced address.
    assert one(resources, "Service", "registry")["spec"].get("clusterIP") != "None"


@ha_variants
def test_registry_settings_load_the_shared_postgres_store(
    variant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    resources = docs(variant)
    settings = load_registry(resources, monkeypatch, tmp_path)
    assert settings.history_store == "postgres"
    dsn = conninfo_to_dict(settings.history_dsn.get_secret_value())
    entries, env = registry_env(resources)
    if variant in IN_CLUSTER:
        # The DSN names the in-namespace database and no password: libpq takes PGPASSWORD.
        assert dsn["host"] == f"postgres.{NAMESPACE}.svc.cluster.local"
        assert "password" not in dsn
        assert secret_ref(entries, "PGPASSWORD") == ("codemode-postgres", "password")
        assert secret_ref(entries, "CODEMODE_REGISTRY_HISTORY_DSN") is None
    else:
        # The whole DSN, password included, is the Secret's.
        assert secret_ref(entries, "CODEMODE_REGISTRY_HISTORY_DSN") == (
            "codemode-postgres-dsn",
            "dsn",
        )
        assert dsn["password"] == "stand-in-password"
        assert "PGPASSWORD" not in env
    # Every replica verifies the parent tokens the others mint: one key, from one Secret.
    assert secret_ref(entries, "CODEMODE_REGISTRY_TOKEN_KEY") == (
        "codemode-registry-auth",
        "token-key",
    )
    assert bytes.fromhex(settings.token_key) == bytes.fromhex("5e" * 32)
    # Cordis places each running plugin's host in one replica with nothing more: the peer
    # secret derives from the shared key and the peer channel is plaintext on the gRPC port
    # (test_replicas_advertise_their_pod_ip_as_peer_address checks the address).
    assert settings.cordis_peer_token() is not None
    assert settings.cordis_peer_secret.get_secret_value() == ""
    assert settings.tls_cert_file is None and settings.listen.startswith("0.0.0.0:")
    assert settings.cordis_peer_tls() is None
    # The same Secret is mounted on every replica, for a JWKS file kept beside the key.
    pod = one(resources, "Deployment", "registry")["spec"]["template"]["spec"]
    (auth,) = [
        v for v in pod["volumes"] if v.get("secret", {}).get("secretName", "").endswith("auth")
    ]
    assert auth["secret"]["secretName"] == "codemode-registry-auth"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == auth["name"]]
    assert mount["mountPath"] == "/etc/codemode-auth" and mount["readOnly"] is True


@ha_variants
def test_replicas_advertise_their_pod_ip_as_peer_address(
    variant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A replica's own name does not resolve (no headless Service with a subdomain): each
    advertises the IP the kubelet gives it, on the port it serves gRPC (and the peer channel)."""
    resources = docs(variant)
    entries, env = registry_env(resources)
    (pod_ip,) = [e for e in entries if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    (container,) = one(resources, "Deployment", "registry")["spec"]["template"]["spec"][
        "containers"
    ]
    grpc_port = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]
    assert env["CODEMODE_REGISTRY_CORDIS_PEER_ADDRESS"] == f"{FIELDS['status.podIP']}:{grpc_port}"
    settings = load_registry(resources, monkeypatch, tmp_path)
    assert settings.cordis_peer_address == f"10.0.0.7:{grpc_port}"
    assert settings.listen.rsplit(":", 1)[1] == str(grpc_port)


@ha_variants
def test_registry_pods_reach_each_others_grpc_port(variant: str) -> None:
    """The peer channel is registry -> registry on the gRPC port: every NetworkPolicy that
    selects registry pods must admit that (today none does, so ingress stays open), and none
    restricting their egress may leave it out."""
    resources = docs(variant)
    registry = pod_labels(resources, "registry")
    (container,) = one(resources, "Deployment", "registry")["spec"]["template"]["spec"][
        "containers"
    ]
    grpc_port = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]

    def admits(rules: list[Doc], side: str) -> bool:
        for rule in rules:
            peers = rule.get(side)
            ports = rule.get("ports")
            peer_ok = peers is None or any(
                "podSelector" in p
                and "namespaceSelector" not in p
                and selects(p["podSelector"], registry)
                for p in peers
            )
            port_ok = ports is None or any(
                p.get("protocol", "TCP") == "TCP" and p.get("port") in (grpc_port, "grpc")
                for p in ports
            )
            if peer_ok and port_ok:
                return True
        return False

    policies = [
        p["spec"]
        for p in find(resources, "NetworkPolicy")
        if selects(p["spec"]["podSelector"], registry)
    ]
    ingress = [p.get("ingress", []) for p in policies if "Ingress" in p["policyTypes"]]
    egress = [p.get("egress", []) for p in policies if "Egress" in p["policyTypes"]]
    # Policies add up: a port is open when any policy of that direction admits it.
    assert not ingress or admits([r for rules in ingress for r in rules], "from")
    assert not egress or admits([r for rules in egress for r in rules], "to")
    # The runtime's policies, which do select pods, are the reason this is checked at all.
    assert find(resources, "NetworkPolicy")


@ha_variants
def test_every_added_kind_is_schema_validated(variant: str) -> None:
    result = run(
        [tool("kubernetes-validate"), "--strict", "-k", K8S_VERSIONS[0], "-"], rendered(variant)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for resource in ("poddisruptionbudget/registry", "service/registry-replicas"):
        assert f"passed for resource {resource}" in result.stdout
    if variant in IN_CLUSTER:
        for resource in (
            "statefulset/postgres",
            "service/postgres",
            "networkpolicy/postgres-allow-registry",
        ):
            assert f"passed for resource {resource}" in result.stdout


@ha_variants
def test_registry_replicas_keep_nothing_on_the_pod(variant: str) -> None:
    resources = docs(variant)
    _, env = registry_env(resources)
    assert "CODEMODE_REGISTRY_HISTORY_PATH" not in env
    pod = one(resources, "Deployment", "registry")["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert not find(resources, "PersistentVolumeClaim"), "prod's SQLite claim is dropped"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/var/lib/codemode" not in mounts


@ha_variants
def test_no_password_or_key_is_written_into_a_manifest(variant: str) -> None:
    resources = docs(variant)
    assert not find(resources, "Secret"), "Secrets are created by the operator, not applied"
    # No connection URI with a password anywhere (comments are gone once rendered).
    assert not URI_PASSWORD.search(rendered(variant))
    for workload in find(resources, "Deployment") + find(resources, "StatefulSet"):
        for container in containers(workload):
            for entry in container.get("env", []):
                where = f"{workload['metadata']['name']}/{container['name']}: {entry['name']}"
                value = entry.get("value")
                if CREDENTIAL.search(entry["name"]):
                    if value is None:
                        assert "secretKeyRef" in entry["valueFrom"], where
                    else:  # only a DSN without its password may be literal
                        assert entry["name"].endswith("_DSN"), where
                        assert "password" not in conninfo_to_dict(value), where
                elif isinstance(value, str) and value.startswith(("postgres://", "postgresql://")):
                    assert "password" not in conninfo_to_dict(value), where


def test_registry_ha_alone_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """registry-ha picks the postgres store; without a postgres component there is no DSN, and
    the registry stops at start instead of running replicas that share nothing."""
    resources = parse(render("overlays/prod", ("components/registry-ha",)))
    with pytest.raises(ConfigError, match="needs history_dsn"):
        load_registry(resources, monkeypatch, tmp_path)


@pytest.mark.parametrize("variant", IN_CLUSTER)
def test_postgres_statefulset_serves_the_registry_dsn(
    variant: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    resources = docs(variant)
    statefulset = one(resources, "StatefulSet", "postgres")
    spec = statefulset["spec"]
    assert spec["replicas"] == 1, "one writer: more pods would be unrelated databases"
    labels = pod_labels(resources, "postgres", "StatefulSet")
    service = one(resources, "Service", spec["serviceName"])["spec"]
    assert service["clusterIP"] == "None"
    assert selects({"matchLabels": service["selector"]}, labels)
    assert not selects({"matchLabels": service["selector"]}, pod_labels(resources, "registry"))
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert PINNED_POSTGRES.fullmatch(container["image"]), container["image"]
    env = resolve_env(container["env"], {**FIELDS, "metadata.namespace": NAMESPACE})
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (service_port,) = service["ports"]
    assert ports[service_port["targetPort"]] == service_port["port"] == 5432

    # The registry's DSN reaches this database, port, role and database name.
    settings = load_registry(resources, monkeypatch, tmp_path)
    dsn = conninfo_to_dict(settings.history_dsn.get_secret_value())
    assert dsn["host"] == f"{spec['serviceName']}.{NAMESPACE}.svc.cluster.local"
    assert str(dsn["port"]) == str(service_port["port"])
    assert dsn["user"] == env["POSTGRES_USER"] and dsn["dbname"] == env["POSTGRES_DB"]

    # Its password comes from a file of the Secret the registry's PGPASSWORD reads.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    password_file = Path(env["POSTGRES_PASSWORD_FILE"])
    secret = volumes[mounts[str(password_file.parent)]]["secret"]
    assert (secret["secretName"], password_file.name) == ("codemode-postgres", "password")
    entries, _ = registry_env(resources)
    assert secret_ref(entries, "PGPASSWORD") == ("codemode-postgres", password_file.name)

    # Data on the claim, in a directory below its root (a volume's lost+found stops initdb).
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    data_mount = [path for path, name in mounts.items() if name == claim["metadata"]["name"]]
    assert Path(env["PGDATA"]).parent == Path(data_mount[0])
    # The read-only root leaves the socket directory to an emptyDir.
    assert "emptyDir" in volumes[mounts["/var/run/postgresql"]]

    # Ready only when the real server takes TCP connections (pg_isready over 127.0.0.1;
    # the entrypoint's initialisation server listens on the Unix socket only).
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[kind]["exec"]["command"]
        assert command[0] == "pg_isready", kind
        assert command[command.index("-h") + 1] == "127.0.0.1", kind
        assert command[command.index("-U") + 1] == env["POSTGRES_USER"], kind


@pytest.mark.parametrize("variant", IN_CLUSTER)
def test_only_registries_reach_postgres(variant: str) -> None:
    resources = docs(variant)
    postgres = pod_labels(resources, "postgres", "StatefulSet")
    policies = [
        p["spec"]
        for p in find(resources, "NetworkPolicy")
        if selects(p["spec"]["podSelector"], postgres)
    ]
    assert policies and all(p["policyTypes"] == ["Ingress"] for p in policies)
    rules = [rule for p in policies for rule in p["ingress"]]
    assert rules
    for rule in rules:
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}
            assert selects(peer["podSelector"], pod_labels(resources, "registry"))
            assert not selects(peer["podSelector"], pod_labels(resources, "runtime"))
        assert rule["ports"] == [{"protocol": "TCP", "port": 5432}]


def test_external_postgres_runs_no_database_in_the_namespace() -> None:
    resources = docs("ha-external-postgres")
    assert not find(resources, "StatefulSet")
    assert not find(resources, "Service", "postgres")
