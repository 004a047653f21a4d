"""The Helm chart: `helm lint --strict`, and the manifests `helm template` renders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import DEPLOY, explain, run_tool
from ruamel.yaml import YAML

CHART = DEPLOY / "helm" / "meridian"
KAFKA_CHART = DEPLOY / "helm" / "meridian-kafka"
KUBE = "1.31.0"  # the Kubernetes version rendered for (the charts need 1.27 or newer)
# Long enough for a first render on a loaded machine; a hung helm is a failure.
pytestmark = pytest.mark.timeout(3000)

VALUES: dict[str, Any] = {
    "region": "eu-west",
    "image": {"repository": "registry.example/meridian", "tag": "0.1.0"},
    "etcd": {"endpoints": "etcd-0.example:2379,etcd-1.example:2379,etcd-2.example:2379"},
    "kafka": {"bootstrap": "kafka.example:9094"},
    "catalog": {"existingSecret": "meridian-catalog", "key": "url"},
    "metrics": {"serviceMonitor": {"enabled": True}},
}


def template(helm: Path) -> list[str | Path]:
    """`helm template` of the chart as the region module installs it."""
    return [helm, "template", "meridian", CHART, "--namespace", "meridian", "--kube-version", KUBE]


def write_values(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    with path.open("w") as handle:
        YAML(typ="safe", pure=True).dump(values, handle)
    return path


def render(helm: Path, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    done = run_tool([*template(helm), "-f", write_values(tmp_path, values)])
    assert done.returncode == 0, explain(done)
    return [doc for doc in YAML(typ="safe", pure=True).load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc["metadata"]["name"], container


@pytest.fixture
def docs(helm: Path, tmp_path: Path) -> list[dict[str, Any]]:
    return render(helm, tmp_path, VALUES)


def test_lint_strict(helm: Path, tmp_path: Path) -> None:
    done = run_tool([helm, "lint", "--strict", CHART, "-f", write_values(tmp_path, VALUES)])
    assert done.returncode == 0, explain(done)
    done = run_tool([helm, "lint", "--strict", KAFKA_CHART])
    assert done.returncode == 0, explain(done)


def test_workloads(docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) == {"meridian-controller", "meridian-replicator"}
    (agents,) = by_kind(docs, "StatefulSet").values()
    claim = agents["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    mounts = agents["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "data", "mountPath": "/data"} in mounts
    args = agents["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--region=eu-west" in args
    assert "--root=/data/store" in args
    assert any(a.startswith("--advertise=$(POD_NAME).meridian-agent-peers.meridian") for a in args)
    replicator = deployments["meridian-replicator"]["spec"]["template"]["spec"]["containers"][0]
    assert "--agent=meridian-agent:7070" in replicator["args"]


def test_every_container_has_probes_resources_and_a_locked_down_context(
    docs: list[dict[str, Any]],
) -> None:
    seen = set()
    for workload, container in containers(docs):
        seen.add(workload)
        requests = container["resources"]["requests"]
        assert requests.get("cpu") and requests.get("memory"), workload
        assert container["readinessProbe"] and container["livenessProbe"], workload
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True, workload
        assert context["readOnlyRootFilesystem"] is True, workload
        assert context["allowPrivilegeEscalation"] is False, workload
        assert context["capabilities"]["drop"] == ["ALL"], workload
    assert seen == {"meridian-controller", "meridian-agent", "meridian-replicator"}


def test_probes_ask_the_right_endpoints(docs: list[dict[str, Any]]) -> None:
    probes = {name: c for name, c in containers(docs)}
    agent = probes["meridian-agent"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert agent[probe]["grpc"]["port"] == 7070, probe  # the agent's Health over gRPC
    for name in ("meridian-controller", "meridian-replicator"):
        for probe in ("readinessProbe", "livenessProbe"):
            assert probes[name][probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}


def test_configuration_from_values_and_the_catalog_from_a_secret(
    docs: list[dict[str, Any]],
) -> None:
    assert not by_kind(docs, "Secret"), "an existing Secret was named: the chart makes none"
    for workload, container in containers(docs):
        env = {item["name"]: item for item in container["env"]}
        assert env["MERIDIAN_ETCD"]["value"] == VALUES["etcd"]["endpoints"], workload
        assert env["MERIDIAN_KAFKA"]["value"] == "kafka.example:9094", workload
        assert env["MERIDIAN_CATALOG"]["valueFrom"]["secretKeyRef"] == {
            "name": "meridian-catalog",
            "key": "url",
        }, workload
        assert "value" not in env["MERIDIAN_CATALOG"], workload


def test_disruption_budgets_select_their_pods(docs: list[dict[str, Any]]) -> None:
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert len(budgets) == 3
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for workload in workloads:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b
            for b in budgets.values()
            if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, workload["metadata"]["name"]
        assert matching[0]["spec"]["maxUnavailable"] == 1


def test_service_monitor_labels_region_and_component(
    docs: list[dict[str, Any]], helm: Path, tmp_path: Path
) -> None:
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics"
    targets = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert targets["region"]["replacement"] == "eu-west"
    assert "component" in targets
    services = by_kind(docs, "Service")
    with_metrics = {
        name
        for name, service in services.items()
        if any(port["name"] == "metrics" for port in service["spec"]["ports"])
    }
    assert with_metrics == {"meridian-controller", "meridian-agent", "meridian-replicator"}
    off = {**VALUES, "metrics": {"serviceMonitor": {"enabled": False}}}
    assert not by_kind(render(helm, tmp_path, off), "ServiceMonitor"), "optional via values"


def test_catalog_url_in_values_makes_a_secret(helm: Path, tmp_path: Path) -> None:
    values = {**VALUES, "catalog": {"url": "postgresql+psycopg://m@db/meridian", "key": "url"}}
    (secret,) = by_kind(render(helm, tmp_path, values), "Secret").values()
    assert secret["stringData"]["url"] == "postgresql+psycopg://m@db/meridian"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"region": ""}, "region is required"),
        ({"etcd": {"endpoints": "https://etcd:2379"}}, "/etcd/endpoints"),
        ({"catalog": {"key": "url"}}, "catalog.existingSecret"),
        ({"image": {"repository": "m", "digest": "sha256:nothex"}}, "/image/digest"),
    ],
)
def test_bad_values_refused_with_the_key_named(
    helm: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    done = run_tool([*template(helm), "-f", write_values(tmp_path, {**VALUES, **change})])
    assert done.returncode != 0
    assert message in done.stderr, explain(done)


def test_kafka_cluster_chart_keeps_meridians_guarantees(helm: Path) -> None:
    done = run_tool([helm, "template", "k", KAFKA_CHART, "--kube-version", KUBE])
    assert done.returncode == 0, explain(done)
    docs = [d for d in YAML(typ="safe", pure=True).load_all(done.stdout) if d]
    (kafka,) = [d for d in docs if d["kind"] == "Kafka"]
    config = kafka["spec"]["kafka"]["config"]
    assert config["unclean.leader.election.enable"] is False
    assert config["auto.create.topics.enable"] is False
    assert config["min.insync.replicas"] == 2
    topics = {d["metadata"]["name"] for d in docs if d["kind"] == "KafkaTopic"}
    assert topics == {"meridian.changes", "meridian.dlq"}


ETCD_CHART = DEPLOY / "helm" / "meridian-etcd"
ETCD_VALUES: dict[str, Any] = {
    "region": "eu-west",
    "members": [
        {"name": n, "region": r, "peerHost": f"{n}.example", "clientHost": f"{n}.example"}
        for n, r in [
            ("a", "eu-west"),
            ("b", "eu-west"),
            ("c", "eu-central"),
            ("d", "us-east"),
            ("e", "us-east"),
        ]
    ],
    "peerTlsSecret": "etcd-peer-tls",
}


def render_etcd(helm: Path, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    done = run_tool(
        [helm, "template", "etcd", ETCD_CHART, "--namespace", "meridian-etcd", "--kube-version",
         KUBE, "-f", write_values(tmp_path, values)]
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    return [doc for doc in YAML(typ="safe", pure=True).load_all(done.stdout) if doc]


def test_etcd_chart_runs_this_regions_members_tuned_for_the_wan(helm: Path, tmp_path: Path) -> None:
    done = run_tool(
        [helm, "lint", "--strict", ETCD_CHART, "-f", write_values(tmp_path, ETCD_VALUES)]
    )
    assert done.returncode == 0, explain(done)
    docs = render_etcd(helm, tmp_path, ETCD_VALUES)
    members = by_kind(docs, "StatefulSet")
    assert set(members) == {"a", "b"}, "only eu-west's members run in eu-west's cluster"
    assert set(by_kind(docs, "Service")) == {"a", "b"}
    command = members["a"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--heartbeat-interval=250" in command
    assert "--election-timeout=2500" in command
    assert "--peer-client-cert-auth" in command
    cluster = next(c for c in command if c.startswith("--initial-cluster="))
    assert cluster.count("=https://") == 5, "every member of every region, peers over TLS"
    container = members["a"]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["port"] == 2381
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}


def test_etcd_chart_refuses_an_election_timeout_under_ten_heartbeats(
    helm: Path, tmp_path: Path
) -> None:
    values = {**ETCD_VALUES, "heartbeatIntervalMs": 250, "electionTimeoutMs": 1000}
    done = run_tool(
        [helm, "template", "etcd", ETCD_CHART, "--kube-version", KUBE, "-f",
         write_values(tmp_path, values)]
    )  # fmt: skip
    assert done.returncode != 0
    assert "electionTimeoutMs must be at least 10 x heartbeatIntervalMs" in done.stderr
