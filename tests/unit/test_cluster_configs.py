"""cluster/: the launcher YAMLs pass Ray's own config schema; the KubeRay manifests are sane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
LAUNCHER = sorted(p for p in CLUSTER.glob("*.yaml") if not p.name.startswith("kuberay"))
KUBERAY = sorted(CLUSTER.glob("kuberay*.yaml"))


def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def test_cluster_files_exist():
    names = {p.name for p in LAUNCHER}
    assert {"aws-gpu.yaml", "local-onprem.yaml"} <= names
    assert KUBERAY
    assert (CLUSTER / "README.md").is_file()


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_yaml_passes_rays_schema(path):
    """As `ray up` does: the file against ray-schema.json, then defaults filled and re-checked."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(path.read_text())
    jsonschema.validate(config, _ray_schema())
    prepared = prepare_config(config)
    validate_config(prepared)
    types = prepared["available_node_types"]
    assert prepared["head_node_type"] in types
    for name, node in types.items():
        assert node.get("min_workers", 0) <= node.get("max_workers", prepared["max_workers"]), name


def test_a_schema_violation_is_caught():
    """The check can fail: an unknown top-level key is refused by Ray's schema."""
    import jsonschema

    config = yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())
    config["max_wrokers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, _ray_schema())


def test_gpu_example_has_an_autoscaling_rollout_node_type():
    config = yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())
    types = config["available_node_types"]
    rollout = types["rollout"]
    assert rollout["resources"].get("rollout", 0) >= 1
    assert rollout["min_workers"] < rollout["max_workers"]
    assert types["learner_teacher"]["resources"].get("learner", 0) >= 1
    assert types[config["head_node_type"]]["resources"].get("CPU") == 0  # nothing runs on head
    assert config["max_workers"] >= sum(t.get("max_workers", 0) for t in types.values())


def _k8s_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_raycluster_spec(spec: dict, where: str) -> None:
    head = spec["headGroupSpec"]
    assert head["rayStartParams"].get("dashboard-host") == "0.0.0.0", where
    assert head["template"]["spec"]["containers"][0]["image"], where
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert {"learner", "rollout"} <= set(groups), where
    for name, g in groups.items():
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], (where, name)
        assert g["template"]["spec"]["containers"][0]["image"], (where, name)
        resources = json.loads(g["rayStartParams"]["resources"].strip("'\"").replace('\\"', '"'))
        assert resources.get(name, 0) >= 1, (where, name)  # the custom resource stages ask for
    assert groups["rollout"]["minReplicas"] < groups["rollout"]["maxReplicas"], where
    assert spec.get("enableInTreeAutoscaling") is True, where


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_manifest_parses_with_required_keys(path):
    docs = _k8s_docs(path)
    assert docs
    for doc in docs:
        for key in ("apiVersion", "kind", "metadata", "spec"):
            assert key in doc, (path.name, key)
        assert doc["apiVersion"].startswith("ray.io/"), path.name
        assert doc["metadata"]["name"], path.name
        if doc["kind"] == "RayCluster":
            _check_raycluster_spec(doc["spec"], path.name)
        elif doc["kind"] == "RayJob":
            spec = doc["spec"]
            assert spec["entrypoint"].startswith("opdflow run "), path.name
            _check_raycluster_spec(spec["rayClusterSpec"], path.name)
        else:
            pytest.fail(f"{path.name}: unexpected kind {doc['kind']}")
