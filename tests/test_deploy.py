"""deploy/: the Containerfile and the Kubernetes manifests (docs/deploy.md).

Every overlay under deploy/kubernetes/overlays/ is rendered by a small renderer below,
which implements exactly the kustomize features the kustomizations use (resources,
namespace, configMapGenerator without name hashes) and refuses any other; where
`kustomize` or `kubectl` is installed, its build must give the same objects. Each
rendered object is validated against the Kubernetes schemas (the PyPI package
kubernetes-validate; the Prometheus Operator's kinds are checked by hand), then the
references between objects are checked (selectors, ports, probes, volumes), and the rsgw
settings they carry (container arguments, the node file, gateway.yml, the environment)
are parsed with rsgw's own command line and configuration parsers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from rsgw._flags import build_parser
from rsgw.config._config import parse_config
from rsgw.node._node import parse_node

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = sorted(p for p in (KUBE / "overlays").iterdir() if (p / "kustomization.yaml").exists())
NAMESPACE = "rsgw"
# The oldest Kubernetes the manifests support; the newest the validator knows is added.
KUBERNETES_VERSIONS = ("1.30",)

Obj = dict[str, Any]

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"})
CUSTOM_GROUPS = ("monitoring.coreos.com/",)
KUSTOMIZATION_KEYS = frozenset(
    {"apiVersion", "kind", "namespace", "resources", "generatorOptions", "configMapGenerator"}
)
GPU = "nvidia.com/gpu"
#: The one workload that is not rsgw: the gateways' etcd, the official image, checked by
#: its own test (`test_the_split_etcd`).
ETCD = "rsgw-etcd"
# Seconds a pod's terminationGracePeriodSeconds keeps beyond preStop + drain.
GRACE_MARGIN = 5.0


# ---------------------------------------------------------------------------
# The renderer.


def render(folder: Path) -> list[Obj]:
    """`kustomize build folder`, for the features deploy/kubernetes uses."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert spec["kind"] == "Kustomization", folder
    unknown = set(spec) - KUSTOMIZATION_KEYS
    assert not unknown, f"{folder}: teach tests/test_deploy.py's renderer {sorted(unknown)}"
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        path = (folder / entry).resolve()
        assert path.is_relative_to(KUBE), f"{folder}: {entry} is outside deploy/kubernetes"
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    options = spec.get("generatorOptions", {})
    assert set(options) <= {"disableNameSuffixHash", "labels"}, folder
    for generator in spec.get("configMapGenerator", []):
        # With name hashes the renderer would have to hash and rewrite references.
        assert options.get("disableNameSuffixHash") is True, folder
        assert set(generator) <= {"name", "files", "options"}, generator
        assert set(generator.get("options", {})) <= {"labels"}, generator
        data: dict[str, str] = {}
        for entry in generator["files"]:
            key, _, relative = entry.rpartition("=")
            path = (folder / relative).resolve()
            assert path.is_relative_to(folder), f"kustomize loads no file outside {folder}"
            data[key or path.name] = path.read_text()
        metadata: Obj = {"name": generator["name"]}
        labels = {**options.get("labels", {}), **generator.get("options", {}).get("labels", {})}
        if labels:
            metadata["labels"] = labels
        configmap: Obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": data,
        }
        objects.append(configmap)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    ids = [identity(obj) for obj in objects]
    assert len(ids) == len(set(ids)), f"{folder}: an object is defined twice"
    return objects


def identity(obj: Obj) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].rpartition("/")[0]
    metadata = obj["metadata"]
    return (group, obj["kind"], metadata.get("namespace", ""), metadata["name"])


@cache
def _rendered(overlay: Path) -> str:
    return json.dumps(render(overlay))


def rendered(overlay: Path) -> list[Obj]:
    """A fresh copy of the overlay's objects (rendered once)."""
    objects: list[Obj] = json.loads(_rendered(overlay))
    return objects


def overlay_ids(path: Path) -> str:
    return path.name


overlays = pytest.mark.parametrize("overlay", OVERLAYS, ids=overlay_ids)


def test_there_are_the_two_shapes() -> None:
    assert {p.name for p in OVERLAYS} == {"node", "split"}


def _kustomize() -> list[str] | None:
    if tool := shutil.which("kustomize"):
        return [tool, "build"]
    if tool := shutil.which("kubectl"):
        return [tool, "kustomize"]
    return None


@overlays
@pytest.mark.skipif(_kustomize() is None, reason="neither kustomize nor kubectl is installed")
def test_the_renderer_agrees_with_kustomize(overlay: Path) -> None:
    command = _kustomize()
    assert command is not None
    built = subprocess.run(
        [*command, str(overlay)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    theirs = [doc for doc in yaml.safe_load_all(built) if doc is not None]
    assert sorted(theirs, key=identity) == sorted(rendered(overlay), key=identity)


# ---------------------------------------------------------------------------
# Helpers over rendered objects.


def of_kind(objects: list[Obj], *kinds: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in kinds]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def selected(objects: list[Obj], selector: Mapping[str, str]) -> list[Obj]:
    """The workloads whose pods carry every label of `selector`."""
    return [w for w in of_kind(objects, *WORKLOADS) if selects(selector, pod_labels(w))]


def containers(workload: Obj) -> list[Obj]:
    return [*pod_spec(workload).get("initContainers", []), *pod_spec(workload)["containers"]]


def container_ports(container: Obj) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def resolve_port(port: int | str, workload: Obj) -> int:
    """A named or numbered port, which some container of the workload must declare."""
    declared: dict[str, int] = {}
    for container in containers(workload):
        declared |= container_ports(container)
    if isinstance(port, str):
        assert port in declared, f"port {port!r} is not declared by {declared}"
        return declared[port]
    assert port in declared.values(), f"port {port} is not declared by {declared}"
    return port


def probes(container: Obj) -> Iterator[tuple[str, Obj]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            yield kind, container[kind]


def probe_port(probe: Obj) -> int | str:
    for handler in ("httpGet", "tcpSocket", "grpc"):
        if handler in probe:
            port: int | str = probe[handler]["port"]
            return port
    raise AssertionError(f"probe without a port: {probe}")


def env_of(container: Obj, pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet sets it (fieldRef: the pod's name)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", var
            env[var["name"]] = pod_name
    return env


def argv_of(container: Obj, env: Mapping[str, str]) -> list[str]:
    """The container's rsgw arguments with $(VAR) expanded as the kubelet does."""
    assert "command" not in container, "the image's ENTRYPOINT is rsgw; set args only"
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def mounted_file(workload: Obj, container: Obj, path: str) -> tuple[Obj, str]:
    """The volume and key behind a file path inside the container."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    file = PurePosixPath(path)
    for mount in container.get("volumeMounts", []):
        if file.parent == PurePosixPath(mount["mountPath"]):
            return volumes[mount["name"]], file.name
    raise AssertionError(f"{path} is on no volume of {container['name']}")


def configmap_file(objects: list[Obj], workload: Obj, container: Obj, path: str) -> str:
    volume, key = mounted_file(workload, container, path)
    assert "configMap" in volume, f"{path} is not from a ConfigMap"
    data: dict[str, str] = named(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    assert key in data, f"ConfigMap {volume['configMap']['name']} has no key {key}"
    return data[key]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert match, duration
    return int(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


_UNITS = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(value: int | str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G|Ki|Mi|Gi)?", str(value))
    assert match, value
    return float(match[1]) * _UNITS.get(match[2] or "", 1.0)


def pre_stop_seconds(container: Obj) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return float(command[1])


# ---------------------------------------------------------------------------
# Schemas.


@overlays
def test_every_object_validates_against_the_kubernetes_schemas(overlay: Path) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    versions = {*KUBERNETES_VERSIONS, validator.utils.latest_version()}
    checked = 0
    for obj in rendered(overlay):
        if obj["apiVersion"].startswith(CUSTOM_GROUPS):
            continue  # not in Kubernetes' schemas: test_the_prometheus_operator_objects
        for version in sorted(versions):
            try:
                validator.validate(obj, version, strict=True)
            except validator.ValidationError as error:
                raise AssertionError(f"{identity(obj)} on Kubernetes {version}: {error}") from None
        checked += 1
    assert checked >= 5


@overlays
def test_the_prometheus_operator_objects(overlay: Path) -> None:
    objects = rendered(overlay)
    monitors = of_kind(objects, "ServiceMonitor", "PodMonitor")
    assert of_kind(monitors, "ServiceMonitor"), "the gateway's metrics are scraped"
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor["spec"]) <= {"selector", "endpoints", "podMetricsEndpoints"}
        selector = monitor["spec"]["selector"]["matchLabels"]
        if monitor["kind"] == "ServiceMonitor":
            services = [s for s in of_kind(objects, "Service") if selects(selector, labels(s))]
            assert len(services) == 1, f"ServiceMonitor selects {len(services)} Services"
            port_names = {p["name"] for p in services[0]["spec"]["ports"]}
            endpoints = monitor["spec"]["endpoints"]
        else:
            assert len(selected(objects, selector)) == 1, "PodMonitor selects one workload"
            (workload,) = selected(objects, selector)
            port_names = {name for c in containers(workload) for name in container_ports(c)}
            endpoints = monitor["spec"]["podMetricsEndpoints"]
        assert endpoints
        for endpoint in endpoints:
            assert endpoint["port"] in port_names
            assert endpoint["path"] == "/metrics"
            # docs/operations.md: the gateway answers within about a second at worst.
            assert 2 <= seconds(endpoint["scrapeTimeout"]) <= seconds(endpoint["interval"])
            for relabel in endpoint.get("relabelings", []):
                assert set(relabel) <= {
                    "action",
                    "sourceLabels",
                    "regex",
                    "targetLabel",
                    "replacement",
                }
                assert relabel["action"] == "replace" and relabel["targetLabel"]
    (rule,) = of_kind(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = yaml.safe_load((ROOT / "grafana" / "alerts.yml").read_text())
    assert rule["spec"] == {"groups": alerts["groups"]}, (
        "deploy/kubernetes/base/prometheusrule.yaml differs from grafana/alerts.yml; "
        "regenerate it as its header says"
    )


def labels(obj: Obj) -> dict[str, str]:
    found: dict[str, str] = obj["metadata"].get("labels", {})
    return found


# ---------------------------------------------------------------------------
# References between objects.


@overlays
def test_everything_is_in_the_namespace(overlay: Path) -> None:
    objects = rendered(overlay)
    namespace = named(objects, "Namespace", NAMESPACE)
    assert labels(namespace)["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, identity(obj)
        assert labels(obj)["app.kubernetes.io/part-of"] == "rsgw", identity(obj)


@overlays
def test_selectors_match_pods_and_ports_exist(overlay: Path) -> None:
    objects = rendered(overlay)
    workloads = of_kind(objects, *WORKLOADS)
    assert workloads
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selected(objects, selector) == [workload], "each workload selects its own pods"
        affinity = pod_spec(workload).get("affinity", {}).get("podAntiAffinity", {})
        for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution", []):
            assert selects(term["labelSelector"]["matchLabels"], pod_labels(workload))
        for weighted in affinity.get("preferredDuringSchedulingIgnoredDuringExecution", []):
            term = weighted["podAffinityTerm"]
            assert selects(term["labelSelector"]["matchLabels"], pod_labels(workload))
    for service in of_kind(objects, "Service"):
        (workload,) = selected(objects, service["spec"]["selector"])
        for port in service["spec"]["ports"]:
            assert resolve_port(port["targetPort"], workload) == port["port"], port
    for budget in of_kind(objects, "PodDisruptionBudget"):
        assert len(selected(objects, budget["spec"]["selector"]["matchLabels"])) == 1
    for policy in of_kind(objects, "NetworkPolicy"):
        (target,) = selected(objects, policy["spec"]["podSelector"]["matchLabels"])
        for rule in policy["spec"]["ingress"]:
            for peer in rule.get("from", []):
                assert selected(objects, peer["podSelector"]["matchLabels"])
            for port in rule["ports"]:
                resolve_port(port["port"], target)
    for stateful in of_kind(objects, "StatefulSet"):
        headless = named(objects, "Service", stateful["spec"]["serviceName"])
        assert headless["spec"]["clusterIP"] == "None"
        assert selected(objects, headless["spec"]["selector"]) == [stateful]


@overlays
def test_probes_use_declared_ports_and_spare_a_busy_pod(overlay: Path) -> None:
    for workload in rsgw_workloads(rendered(overlay)):
        for container in pod_spec(workload)["containers"]:
            kinds = dict(probes(container))
            assert set(kinds) == {"startupProbe", "readinessProbe", "livenessProbe"}
            for probe in kinds.values():
                resolve_port(probe_port(probe), workload)
            ports = container_ports(container)
            ready = kinds["readinessProbe"]
            # grpc.health.v1 on the gRPC port (rsgw serves it), or /readyz on the admin port.
            if "grpc" in ready:
                assert ready["grpc"]["port"] == ports["grpc"]
                assert ready["grpc"].get("service", "") == ""
            else:
                assert ready["httpGet"]["path"] == "/readyz"
            live = kinds["livenessProbe"]
            assert live["httpGet"]["path"] == "/healthz", "readiness is no liveness"
            assert resolve_port(live["httpGet"]["port"], workload) == ports["metrics"]
            assert live["failureThreshold"] * live["periodSeconds"] >= 60
            assert live["timeoutSeconds"] >= 5


@overlays
def test_pods_are_locked_down(overlay: Path) -> None:
    objects = rendered(overlay)
    uid = containerfile_user()
    assert not of_kind(objects, "Secret"), "secret values are not part of the manifests"
    for workload in rsgw_workloads(objects):
        spec = pod_spec(workload)
        named(objects, "ServiceAccount", spec["serviceAccountName"])
        assert spec["automountServiceAccountToken"] is False
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == uid
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            assert set(volume) - {"name"} <= {"configMap", "secret", "emptyDir"}, volume
            if "configMap" in volume:
                named(objects, "ConfigMap", volume["configMap"]["name"])
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "rsgw-auth"
                assert volume["secret"]["defaultMode"] & 0o7027 == 0, "not world-readable"
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert not context.get("privileged")
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert set(mounts.values()) <= set(volumes)
            assert "emptyDir" in volumes[mounts["/tmp"]], "a writable /tmp"
            resources = container["resources"]
            for key in ("cpu", "memory"):
                request = quantity(resources["requests"][key])
                assert 0 < request <= quantity(resources["limits"][key])
            if GPU in resources["limits"] or GPU in resources["requests"]:
                assert resources["limits"][GPU] == resources["requests"][GPU]
                terms = spec["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"
                ]["nodeSelectorTerms"]
                keys = {e["key"] for t in terms for e in t["matchExpressions"]}
                assert "nvidia.com/gpu.present" in keys
            assert container["image"] == "rsgw:dev"


# ---------------------------------------------------------------------------
# What the containers run, read by rsgw itself.


def gpu_count(container: Obj) -> int:
    return int(container["resources"]["limits"].get(GPU, 0))


def check_drain(workload: Obj, container: Obj, drain_seconds: float) -> None:
    """SIGTERM's drain fits between the preStop sleep and the kubelet's SIGKILL."""
    budget = pod_spec(workload)["terminationGracePeriodSeconds"]
    assert pre_stop_seconds(container) >= 5
    assert budget >= pre_stop_seconds(container) + drain_seconds + GRACE_MARGIN


def check_gateway(
    objects: list[Obj], workload: Obj, container: Obj, raw: object, env: Mapping[str, str]
) -> None:
    config = parse_config(raw, env, source=str(workload["metadata"]["name"]))
    assert not config.warnings, config.warnings
    ports = container_ports(container)
    assert port_of(config.listen.grpc) == ports["grpc"]
    assert port_of(config.listen.metrics) == ports["metrics"]
    # Authentication on, from the Secret's volume.
    volume, _ = mounted_file(workload, container, config.auth.tokens_file)
    assert volume["secret"]["secretName"] == "rsgw-auth"
    check_drain(workload, container, config.shutdown.grace_seconds)


@overlays
def test_the_containers_run_what_rsgw_accepts(overlay: Path) -> None:
    objects = rendered(overlay)
    commands: set[str] = set()
    for workload in rsgw_workloads(objects):
        for container in pod_spec(workload)["containers"]:
            env = env_of(container, f"{workload['metadata']['name']}-0")
            args = build_parser().parse_args(argv_of(container, env))
            commands.add(args.command)
            ports = container_ports(container)
            if args.command == "node":
                text = configmap_file(objects, workload, container, args.node_file)
                gpus = gpu_count(container)
                node = parse_node(yaml.safe_load(text), source="node.yml", visible_gpus=gpus)
                assert len(node.workers) == gpus, "one worker per GPU of the pod"
                # Without GPUs (a trial cluster) the node simulates as many.
                simulated = parse_node(yaml.safe_load(text), source="node.yml")
                assert len(simulated.workers) == gpus
                for worker in node.workers:
                    assert worker.host == "127.0.0.1", "workers check no tokens: loopback"
                    assert {worker.port, worker.metrics_port}.isdisjoint(ports.values())
                # What the supervisor hands its embedded gateway (docs/configuration.md).
                workers = node.workers
                supervised = {
                    **env,
                    "REACTANT_GATEWAY_WORKERS": ",".join(f"127.0.0.1:{w.port}" for w in workers),
                    "REACTANT_GATEWAY_WORKER_METRICS": ",".join(
                        f"127.0.0.1:{w.metrics_port}" for w in workers
                    ),
                    "REACTANT_GATEWAY_WORKER_NAMES": ",".join(w.name for w in workers),
                }
                check_gateway(objects, workload, container, {}, supervised)
            elif args.command == "run":
                text = configmap_file(objects, workload, container, args.config)
                check_gateway(objects, workload, container, yaml.safe_load(text), env)
                assert gpu_count(container) == 0
            elif args.command == "worker":
                assert (args.port, args.metrics_port) == (ports["grpc"], ports["metrics"])
                assert args.host == "0.0.0.0" and args.name == env["POD_NAME"]
                assert gpu_count(container) == 1
                check_drain(workload, container, args.shutdown_grace)
            else:
                raise AssertionError(f"unexpected rsgw {args.command}")
    assert commands == ({"node"} if overlay.name == "node" else {"run", "worker"})


def split_gateway_yml() -> Any:
    objects = rendered(KUBE / "overlays" / "split")
    gateway = named(objects, "Deployment", "rsgw-gateway")
    (container,) = pod_spec(gateway)["containers"]
    path = build_parser().parse_args(container["args"]).config
    return yaml.safe_load(configmap_file(objects, gateway, container, path))


def test_the_split_gateway_finds_its_workers_by_dns() -> None:
    objects = rendered(KUBE / "overlays" / "split")
    workers = named(objects, "StatefulSet", "rsgw-worker")
    service = named(objects, "Service", workers["spec"]["serviceName"])
    namespace = service["metadata"]["namespace"]
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
    domain = f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    raw = split_gateway_yml()
    assert raw["endpoints"] == [f"dns:///{domain}:{port}"]
    assert "worker_names" not in raw, "a DNS target's workers are labelled by address"
    assert raw["metrics_endpoints"] == [], "the PodMonitor scrapes the workers"
    assert service["spec"]["clusterIP"] == "None", "headless: one address per pod"
    assert service["spec"]["publishNotReadyAddresses"] is False, "DNS names ready workers only"
    # The PodMonitor labels each worker's own series as the gateway labels the worker.
    monitor = named(objects, "PodMonitor", "rsgw-workers")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (worker,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "worker"]
    assert worker["sourceLabels"] == ["__meta_kubernetes_pod_ip"]
    assert worker["replacement"] == f"${{1}}:{port}"


def rsgw_workloads(objects: list[Obj]) -> list[Obj]:
    return [w for w in of_kind(objects, *WORKLOADS) if w["metadata"]["name"] != ETCD]


def test_the_split_etcd() -> None:
    """Three members of the official image, pinned, locked down as rsgw's pods are, with
    their data on volumes; the gateways' etcd_endpoints are exactly its members' client
    URLs, and its peers exactly its members."""
    objects = rendered(KUBE / "overlays" / "split")
    etcd = named(objects, "StatefulSet", ETCD)
    spec = pod_spec(etcd)
    (container,) = spec["containers"]
    assert re.fullmatch(r"gcr\.io/etcd-development/etcd:v3\.5\.\d+", container["image"])
    replicas = etcd["spec"]["replicas"]
    assert replicas == 3
    service = named(objects, "Service", etcd["spec"]["serviceName"])
    domain = f"{ETCD}.{service['metadata']['namespace']}.svc.cluster.local"
    members = [f"{ETCD}-{i}" for i in range(replicas)]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    assert flags["initial-cluster"] == ",".join(f"{m}=http://{m}.{domain}:2380" for m in members)
    assert service["spec"]["publishNotReadyAddresses"] is True, "peers meet before ready"
    raw = split_gateway_yml()
    assert raw["coordination"]["etcd_endpoints"] == [f"{m}.{domain}:2379" for m in members]
    assert raw["scheduling"]["mode"] == "lpt_packing"
    # Locked down like rsgw's own pods.
    security = spec["securityContext"]
    assert (
        security["runAsNonRoot"] is True and security["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert spec["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"]
    assert context["capabilities"]["drop"] == ["ALL"]
    (claim,) = etcd["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/var/run/etcd": claim["metadata"]["name"]}
    assert flags["data-dir"].startswith("/var/run/etcd/")
    kinds = dict(probes(container))
    assert set(kinds) == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert kinds["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert kinds["livenessProbe"]["httpGet"]["path"] == "/livez"
    for probe in kinds.values():
        assert resolve_port(probe_port(probe), etcd) == 2381
    # Only the gateways (and its own members) may reach its client port.
    policy = named(objects, "NetworkPolicy", ETCD)
    clients = policy["spec"]["ingress"][0]
    (peer,) = clients["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    gateway = named(objects, "Deployment", "rsgw-gateway")
    assert gateway["spec"]["replicas"] >= 2
    (gateway_container,) = pod_spec(gateway)["containers"]
    env = {e["name"]: e for e in gateway_container["env"]}
    member = env["REACTANT_GATEWAY_COORDINATION_MEMBER"]["valueFrom"]["fieldRef"]
    assert member["fieldPath"] == "metadata.name"


def test_the_split_gateway_yml_parses_with_rsgw() -> None:
    config = parse_config(split_gateway_yml(), {}, source="gateway.yml")
    assert not config.warnings, config.warnings
    assert config.endpoints == ("dns:///rsgw-workers.rsgw.svc.cluster.local:8001",)


# ---------------------------------------------------------------------------
# The Containerfile and the copies of grafana/.


def containerfile() -> list[tuple[str, str]]:
    """The Containerfile's instructions: (INSTRUCTION, arguments), continuations joined."""
    text = re.sub(r"\\\n\s*", "", (DEPLOY / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line)
        if not word.startswith("#")
    ]


def containerfile_user() -> int:
    (user,) = [rest for word, rest in containerfile() if word == "USER"]
    uid = int(user.partition(":")[0])
    assert uid != 0
    return uid


def readme_quick_start() -> list[str]:
    """The README's quick-start command, split at `&&`."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    match = re.search(r"```sh\n(.+?)\n```", section, re.S)
    assert match, "the README's quick start has a sh block"
    return [step.strip() for step in match[1].split("&&")]


def test_the_containerfile_installs_and_runs_as_the_readme_says() -> None:
    steps = readme_quick_start()
    install = [s for s in steps if not s.startswith("rsgw ")]
    (run,) = [s for s in steps if s.startswith("rsgw ")]
    instructions = containerfile()
    runs = [rest for word, rest in instructions if word == "RUN"]
    assert " && ".join(install) in runs, f"no RUN line is the README's install: {install}"
    assert any(word == "FROM" and rest == "python:3.11-slim" for word, rest in instructions)
    entrypoint = [json.loads(rest) for word, rest in instructions if word == "ENTRYPOINT"]
    command = [json.loads(rest) for word, rest in instructions if word == "CMD"]
    assert entrypoint[-1] + command[-1] == shlex.split(run)
    # What it copies exists, and is what `pip install -e .` needs.
    for word, rest in instructions:
        if word == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), source
    exposed = {int(p) for word, rest in instructions if word == "EXPOSE" for p in rest.split()}
    node = named(rendered(KUBE / "overlays" / "node"), "Deployment", "rsgw-node")
    (container,) = pod_spec(node)["containers"]
    assert exposed == set(container_ports(container).values())
    assert containerfile_user() == pod_spec(node)["securityContext"]["runAsUser"]


def test_the_dashboards_are_copies_of_grafanas() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    copies = {p.name: p.read_bytes() for p in (BASE / "dashboards").glob("*.json")}
    assert copies == source, (
        "deploy/kubernetes/base/dashboards/ differs from grafana/dashboards/: "
        "cp grafana/dashboards/*.json deploy/kubernetes/base/dashboards/"
    )
    for overlay in OVERLAYS:
        board = named(rendered(overlay), "ConfigMap", "rsgw-dashboards")
        assert labels(board)["grafana_dashboard"] == "1"
        assert board["data"] == {name: text.decode() for name, text in source.items()}


def test_docs_deploy_names_the_overlays() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for overlay in OVERLAYS:
        assert f"kubectl apply -k deploy/kubernetes/overlays/{overlay.name}" in doc
    assert "docker build -f deploy/Containerfile" in doc
