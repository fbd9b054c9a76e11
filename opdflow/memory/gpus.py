"""GPU memory by name: what one GPU of a node holds, from the instance or accelerator type.

`opdflow validate --cluster-yaml FILE` plans memory on the GPUs the file's node types name:
an AWS `InstanceType`, a GCP `machineType` or `guestAccelerators` type, an Azure `vmSize`, a
KubeRay group's `nodeSelector` (e.g. `cloud.google.com/gke-accelerator`,
`nvidia.com/gpu.product`, `node.kubernetes.io/instance-type`), or Ray's own
`accelerator_type:NAME` resource. Memory is what the device reports, in GB (1e9 bytes),
rounded down: a nominal "80 GB" (GiB) H100 reports 85.0 GB. A node type that names none
of these has no known GPU memory: `--gpu-mem` gives it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPUS: dict[str, float] = {
    "GH200": 102.0, "H200": 150.0, "H100": 85.0, "B200": 190.0, "A100": 42.0, "L40S": 47.5,
    "L40": 47.5, "A10G": 23.5, "A10": 23.5, "L4": 23.5, "T4": 15.5, "V100": 16.5,
}  # fmt: skip
"""Memory (GB) one GPU reports (torch.cuda.get_device_properties(0).total_memory / 1e9,
rounded down), by accelerator name, for the size it ships in when no size is named."""

SIZED: dict[tuple[str, int], float] = {
    ("A100", 40): 42.0, ("A100", 80): 85.0, ("H100", 80): 85.0, ("H100", 94): 99.0,
    ("H200", 141): 150.0, ("GH200", 96): 102.0, ("GH200", 144): 150.0, ("V100", 16): 16.5,
    ("V100", 32): 33.5,
}  # fmt: skip
"""The same for a GPU named with its nominal size ("A100 80GB", "nvidia-a100-80gb"): other
sizes count as their nominal GB, which understates what the device reports."""

INSTANCES: dict[str, str] = {
    # AWS (prefix of the instance type)
    "p4d.": "A100", "p4de.": "A100 80GB", "p5.": "H100", "p5e.": "H200", "p5en.": "H200",
    "p6-b200.": "B200", "g6e.": "L40S", "g5.": "A10G", "g6.": "L4", "g4dn.": "T4",
    "p3.": "V100",
    # GCP machine types
    "a3-ultragpu": "H200", "a3-": "H100", "a2-ultragpu": "A100 80GB", "a2-": "A100",
    "g2-": "L4", "a4-": "B200",
    # Azure VM sizes
    "standard_nd96amsr_a100": "A100 80GB", "standard_nd96asr": "A100",
    "standard_nd96isr_h100": "H100", "standard_nd96isr_h200": "H200",
    "standard_nc24ads_a100": "A100 80GB",
}  # fmt: skip
"""GPU of an instance or machine type, by the type's prefix (lower case)."""


def gpu_memory(name: str) -> tuple[float, str] | None:
    """(GB, accelerator) of a GPU, instance or machine type name; None if unknown."""
    text = name.strip().lower()
    for prefix, gpu in sorted(INSTANCES.items(), key=lambda kv: -len(kv[0])):
        if text.startswith(prefix):
            text = gpu.lower()
            break
    words = re.sub(r"[^a-z0-9]+", " ", text).split()
    for gpu in sorted(GPUS, key=len, reverse=True):
        if gpu.lower() not in words:
            continue
        sized = next((int(w[:-2]) for w in words if re.fullmatch(r"\d+gb", w)), None)
        if sized and (gpu != "GH200" or sized in (96, 144)):  # GH200-480GB: with CPU memory
            return SIZED.get((gpu, sized), float(sized)), f"{gpu} {sized}GB"
        if gpu == "H100" and "nvl" in words:
            return SIZED[("H100", 94)], "H100 NVL"
        return GPUS[gpu], gpu
    return None


def _launcher_hints(node_type: dict[str, Any]) -> list[str]:
    config = node_type.get("node_config") or {}
    hints = [str(config[k]) for k in ("InstanceType", "machineType", "vmSize") if k in config]
    hints += [str(a.get("acceleratorType", "")) for a in config.get("guestAccelerators") or []]
    azure = (config.get("azure_arm_parameters") or {}).get("vmSize")
    return hints + ([str(azure)] if azure else [])


def _kuberay_hints(group: dict[str, Any]) -> list[str]:
    spec = (group.get("template") or {}).get("spec") or {}
    return [str(v) for v in (spec.get("nodeSelector") or {}).values()]


def _ray_accelerator(resources: Any) -> list[str]:
    return [k.split(":", 1)[1] for k in (resources or {}) if str(k).startswith("accelerator_type:")]


def node_type_gpus(path: str | Path) -> dict[str, tuple[float, str] | None]:
    """Node type name -> (GB per GPU, what named it) for each node type of a cluster file,
    None where the file names no GPU the table knows."""
    import yaml

    from opdflow.cluster.clusterfile import load_cluster_file

    cluster = load_cluster_file(path)  # checks the file; names its node types
    hints: dict[str, list[str]] = {t.name: _ray_accelerator(t.resources) for t in cluster.types}
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if not isinstance(doc, dict):
            continue
        for name, t in (doc.get("available_node_types") or {}).items():
            hints.setdefault(name, []).extend(_launcher_hints(t))
        spec = doc.get("spec") or {}
        spec = spec.get("rayClusterSpec", spec)
        if "headGroupSpec" in spec:
            hints["head"] += _kuberay_hints(spec["headGroupSpec"])
            for g in spec.get("workerGroupSpecs") or []:
                hints.setdefault(g.get("groupName", "workers"), []).extend(_kuberay_hints(g))
    out: dict[str, tuple[float, str] | None] = {}
    for name, names in hints.items():
        found = next(((m, h) for h in names if (m := gpu_memory(h))), None)
        out[name] = (found[0][0], f"{found[0][1]}, {found[1]}") if found else None
    return out


def placed_gpus(path: str | Path, where: dict[str, str]) -> Callable[[str], Any]:
    """An actor's GPU (GB, what) on the node a cluster-file placement put it on (`where`:
    actor -> node label, from clusterfile.fit_cluster_file); None where unknown."""
    from opdflow.cluster.clusterfile import load_cluster_file

    kind = {label: t.name for t, label in load_cluster_file(path).typed_nodes()}
    memory = node_type_gpus(path)
    return lambda actor: memory.get(kind.get(where.get(actor, ""), ""))
