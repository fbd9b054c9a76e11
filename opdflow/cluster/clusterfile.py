"""Cluster files: the nodes a Ray cluster launcher YAML or a KubeRay manifest can bring up.

`opdflow validate PIPELINE --cluster-yaml cluster/X.yaml` places every actor of a pipeline
on those nodes, as `--cluster NxG:C` does for a described cluster (placement.fit): the
head, then the nodes that always run (min_workers), then the ones the autoscaler can add
(up to each type's max_workers and the file's max_workers). A node's CPUs, GPUs and custom
resources must be written in the file: Ray detects CPUs and GPUs of a cloud instance at
launch, which a check without the cloud cannot, so a node type that leaves them out is
refused with what to add.

Read: Ray cluster launcher files (`available_node_types`, each with `resources`,
`min_workers`, `max_workers`; the `local` provider's head and `worker_ips`, with
`--num-cpus` / `--num-gpus` / `--resources` on the `ray start` lines) and KubeRay
`RayCluster` / `RayJob` manifests (head group and worker groups: rayStartParams
`num-cpus` / `num-gpus` / `resources`, else the container's cpu and nvidia.com/gpu limits).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


@dataclass(frozen=True)
class NodeType:
    """One kind of node in a cluster file."""

    name: str
    resources: dict[str, float]
    """Ray resources of one such node: CPU, GPU and custom ones."""
    min_workers: int = 0
    """Nodes of this type that always run (the head: 1)."""
    max_workers: int = 0
    """Most nodes of this type (the head: 1)."""
    head: bool = False
    what: str = ""
    """The machine, where the file says (an instance type), for messages."""


@dataclass(frozen=True)
class ClusterFile:
    """The node types of a cluster file and its cap on worker nodes."""

    path: str
    types: list[NodeType] = field(default_factory=list)
    max_workers: int = 0
    """Most worker nodes (head excluded) the cluster may have at once."""

    def nodes(self) -> tuple[list[dict[str, float]], list[str]]:
        """Every node the cluster can have, in the order a scheduler fills them (head,
        always-running workers, then the ones the autoscaler adds), with their labels."""
        out = self.typed_nodes()
        return [dict(t.resources) for t, _ in out], [label for _, label in out]

    def typed_nodes(self) -> list[tuple[NodeType, str]]:
        """`nodes()` as (node type, label) pairs, in the same order."""
        out: list[tuple[NodeType, str]] = []
        for t in self.types:
            if t.head:
                out.append((t, f"{t.name} (head)"))
        for first in (True, False):
            for t in (t for t in self.types if not t.head):
                lo, hi = (0, t.min_workers) if first else (t.min_workers, t.max_workers)
                for i in range(lo, min(hi, self.max_workers)):
                    out.append((t, f"{t.name}[{i}]" + (f" ({t.what})" if t.what else "")))
        return out


def _number(text: Any, where: str) -> float:
    """A Kubernetes quantity or a plain number: "8", "500m", 2."""
    s = str(text).strip()
    try:
        return float(s[:-1]) / 1000 if s.endswith("m") else float(s)
    except ValueError:
        raise ConfigError(f"{where} = {text!r} is not a number") from None


def _resources_json(text: Any, where: str) -> dict[str, float]:
    """`--resources` / rayStartParams.resources: JSON, possibly quoted once more."""
    s = str(text).strip()
    for _ in range(3):  # '"{\"rollout\": 1}"' in KubeRay manifests
        try:
            value = json.loads(s)
        except ValueError:
            raise ConfigError(f"{where} = {text!r} is not a JSON object of resources") from None
        if isinstance(value, dict):
            return {str(k): float(v) for k, v in value.items()}
        s = str(value)
    raise ConfigError(f"{where} = {text!r} is not a JSON object of resources")


def _launcher_types(path: Path, config: dict[str, Any]) -> list[NodeType]:
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    out = []
    for name, t in types.items():
        res = {k: float(v) for k, v in (t.get("resources") or {}).items()}
        instance = (t.get("node_config") or {}).get("InstanceType", "")
        missing = [k for k in ("CPU", "GPU") if k not in res]
        if missing:
            raise ConfigError(
                f"{path}: node type {name!r}" + (f" ({instance})" if instance else "")
                + f" does not state its {' and '.join(missing)} in `resources`; Ray detects "
                "them when it launches the node, a check without the cloud cannot: add e.g. "
                + ", ".join(f'"{k}": N' for k in missing) + " to its resources"
            )  # fmt: skip
        is_head = name == head
        lo = 1 if is_head else int(t.get("min_workers", 0))
        hi = 1 if is_head else int(t.get("max_workers", config.get("max_workers", 0)))
        out.append(NodeType(name, res, lo, hi, is_head, instance))
    if head not in types:
        raise ConfigError(f"{path}: head_node_type {head!r} is not in available_node_types")
    return out


def _ray_start(commands: list[str], path: Path, who: str) -> dict[str, float]:
    """Resources a node advertises from its `ray start` line (local provider)."""
    line = next((c for c in commands if "ray start" in c), None)
    if line is None:
        raise ConfigError(f"{path}: the {who}'s start commands have no `ray start` line")
    args = shlex.split(line[line.index("ray start") :])
    opts: dict[str, str] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            key, eq, value = a[2:].partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            opts[key] = value
    missing = [f"--{k}" for k in ("num-cpus", "num-gpus") if k not in opts]
    if missing:
        raise ConfigError(
            f"{path}: the {who}'s `ray start` line does not say {' and '.join(missing)}; "
            "Ray detects the machine's CPUs and GPUs when it starts, a check cannot: add "
            + " ".join(f"{m}=N" for m in missing) + " (what the machines have)"
        )  # fmt: skip
    res = {"CPU": _number(opts["num-cpus"], f"{who} --num-cpus")}
    res["GPU"] = _number(opts["num-gpus"], f"{who} --num-gpus")
    if "resources" in opts:
        res.update(_resources_json(opts["resources"], f"{path}: {who} --resources"))
    return res


def _local_types(path: Path, config: dict[str, Any]) -> list[NodeType]:
    provider = config["provider"]
    workers = len(provider.get("worker_ips") or [])
    head = _ray_start(config.get("head_start_ray_commands") or [], path, "head")
    types = [NodeType("head", head, 1, 1, True, str(provider.get("head_ip", "")))]
    if workers:
        res = _ray_start(config.get("worker_start_ray_commands") or [], path, "workers")
        types.append(NodeType("worker", res, workers, workers, False))
    return types


def _group_resources(group: dict[str, Any], path: Path, name: str) -> dict[str, float]:
    params = group.get("rayStartParams") or {}
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    where = f"{path}: group {name}"
    cpu = params.get("num-cpus", limits.get("cpu"))
    if cpu is None:
        raise ConfigError(
            f"{where} states no CPUs: set rayStartParams num-cpus or the container's cpu limit"
        )
    res = {"CPU": _number(cpu, f"{where} CPUs")}
    res["GPU"] = _number(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)), f"{where} GPUs")
    if "resources" in params:
        res.update(_resources_json(params["resources"], f"{where} rayStartParams.resources"))
    return res


def _kuberay_types(path: Path, spec: dict[str, Any]) -> list[NodeType]:
    types = [NodeType("head", _group_resources(spec["headGroupSpec"], path, "head"), 1, 1, True)]
    for g in spec.get("workerGroupSpecs") or []:
        name = g.get("groupName", "workers")
        lo = int(g.get("minReplicas", g.get("replicas", 0)))
        hi = int(g.get("maxReplicas", g.get("replicas", lo)))
        types.append(NodeType(name, _group_resources(g, path, name), lo, hi))
    return types


def load_cluster_file(path: str | Path) -> ClusterFile:
    """The nodes a cluster launcher YAML or a KubeRay RayCluster/RayJob manifest declares."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--cluster-yaml {p}: file not found (e.g. cluster/aws-gpu.yaml)")
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
    except yaml.YAMLError as exc:
        raise ConfigError(f"--cluster-yaml {p}: not YAML: {exc}") from exc
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        if kind in ("RayCluster", "RayJob"):
            spec = doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterSpec"]
            types = _kuberay_types(p, spec)
            cap = sum(t.max_workers for t in types if not t.head)
            return ClusterFile(str(p), types, cap)
        if "available_node_types" in doc or "provider" in doc:
            if (doc.get("provider") or {}).get("type") == "local":
                types = _local_types(p, doc)
            else:
                types = _launcher_types(p, doc)
            cap = int(doc.get("max_workers", sum(t.max_workers for t in types if not t.head)))
            return ClusterFile(str(p), types, cap)
    raise ConfigError(
        f"--cluster-yaml {p}: neither a Ray cluster launcher file (available_node_types or "
        "provider) nor a KubeRay RayCluster / RayJob manifest"
    )


def fit_cluster_file(cfg: PipelineConfig, cluster: ClusterFile) -> dict[str, str]:
    """Place every actor of `cfg` on the cluster's nodes (placement.fit); returns actor ->
    node label. A ConfigError names the stage that does not fit, what it asks and the
    largest node, or the worker nodes it would take beyond max_workers."""
    from opdflow.cluster.placement import fit

    nodes, names = cluster.nodes()
    try:
        where = fit(cfg, nodes, names)
    except ConfigError as exc:
        raise ConfigError(f"{cluster.path}: {exc}") from exc
    head = sum(t.head for t in cluster.types)
    always = sum(min(t.min_workers, cluster.max_workers) for t in cluster.types if not t.head)
    workers = len({i for i in where.values() if i >= head} | set(range(head, head + always)))
    if workers > cluster.max_workers:  # each type's cap alone let more through
        raise ConfigError(
            f"{cluster.path}: the pipeline needs {workers} worker nodes, but max_workers is "
            f"{cluster.max_workers}; raise max_workers or ask for fewer resources"
        )
    return {actor: names[i] for actor, i in where.items()}
