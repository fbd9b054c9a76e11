"""cluster/: the launcher YAMLs pass Ray's own config schema; the KubeRay manifests are sane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

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


# ---------------------------------------------------------------- pipelines on cluster files

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
GPU_FILES = ("aws-gpu.yaml", "kuberay-raycluster.yaml", "kuberay-rayjob.yaml")
"""Cluster files with GPU nodes: meant for every shipped pipeline. local-onprem.yaml (CPU
machines) is meant for the CPU pipelines (tiny_*.py), not the GPU ones (dapo_math.py)."""
HEADER_OVERRIDES = {
    # what each file's header tells a user to --set when submitting the tiny demo to it
    "aws-gpu.yaml": [
        'resources.generator.resources={"rollout": 1}',
        'resources.learner.resources={"learner": 1}',
        "engine.min_replicas=1",
        "engine.max_replicas=8",
        "engine.kind=vllm",
    ],
    "local-onprem.yaml": ['resources.generator.resources={"rollout": 1}'],
    "kuberay-raycluster.yaml": [
        'resources.generator.resources={"rollout": 1}',
        "engine.max_replicas=8",
    ],
    "kuberay-rayjob.yaml": [
        'resources.generator.resources={"rollout": 1}',
        "engine.max_replicas=8",
    ],
}


def _pipeline_specs() -> list[str]:
    from opdflow.config.loader import pipeline_functions

    return [
        f"{path.name}:{fn}"
        for path in sorted(PIPELINES.glob("*.py"))
        for fn in pipeline_functions(path)
    ]


def _meant_for(spec: str, cluster: str) -> bool:
    return cluster in GPU_FILES or not spec.startswith("dapo_math")


@pytest.mark.parametrize("cluster", [p.name for p in sorted(CLUSTER.glob("*.yaml"))])
def test_every_shipped_pipeline_fits_every_cluster_file_meant_for_it(cluster):
    from opdflow.cluster.clusterfile import fit_cluster_file, load_cluster_file
    from opdflow.config.loader import load_pipeline

    cf = load_cluster_file(CLUSTER / cluster)
    specs = [s for s in _pipeline_specs() if _meant_for(s, cluster)]
    assert specs and (cluster != "aws-gpu.yaml" or any("dapo_math" in s for s in specs))
    for spec in specs:
        cfg = load_pipeline(f"{PIPELINES}/{spec}")
        where = fit_cluster_file(cfg, cf)
        assert len(where) == 3 + cfg.resources.learner.workers + max(
            cfg.engine.replicas, cfg.engine.max_replicas or 0
        ), spec
        if not cf.nodes()[0][0]["CPU"]:  # a head without CPUs runs the driver only
            assert not any("(head)" in node for node in where.values()), spec
    tiny = load_pipeline(f"{PIPELINES}/tiny_cpu.py", HEADER_OVERRIDES[cluster])
    steered = fit_cluster_file(tiny, cf)  # the header's own example lands where it says
    assert all(steered[f"generator[{i}]"].startswith(("rollout", "worker")) for i in range(1))


def test_dapo_math_places_on_the_aws_file_as_its_header_says():
    """The paper's 8 GPUs on the learner_teacher node; replicas beyond them on rollout nodes,
    one each, up to the file's max_workers."""
    from opdflow.cluster.clusterfile import fit_cluster_file, load_cluster_file
    from opdflow.config.loader import load_pipeline
    from opdflow.errors import ConfigError

    cf = load_cluster_file(CLUSTER / "aws-gpu.yaml")
    where = fit_cluster_file(load_pipeline(f"{PIPELINES}/dapo_math.py:student_7b"), cf)
    assert set(where.values()) == {"learner_teacher[0] (p4de.24xlarge)"}
    big = fit_cluster_file(load_pipeline(f"{PIPELINES}/dapo_math.py:student_7b_2x8"), cf)
    rollout = [a for a, n in big.items() if n.startswith("rollout")]
    assert len(rollout) == 8 and len({big[a] for a in rollout}) == 8
    more = load_pipeline(f"{PIPELINES}/dapo_math.py:student_7b_2x8", ["engine.replicas=11"])
    with pytest.raises(ConfigError, match=r"generator\[10\] \(resources.generator\) needs"):
        fit_cluster_file(more, cf)  # no 9th rollout node (max_workers 8 for the type)


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


TOO_SMALL = """
cluster_name: small
max_workers: 9
provider: {type: aws, region: us-west-2}
available_node_types:
  head: {resources: {CPU: 0, GPU: 0}, node_config: {InstanceType: m6i.2xlarge}}
  learner_teacher:
    min_workers: 1
    max_workers: 1
    resources: {CPU: 96, GPU: 8, learner: 1}
    node_config: {InstanceType: p4de.24xlarge}  # A100 80GB: the memory plan fits the 7B there
  rollout:
    min_workers: 1
    max_workers: 8
    resources: {CPU: 4, GPU: 1, rollout: 1}
    node_config: {InstanceType: g6e.xlarge}
head_node_type: head
"""


def test_a_cluster_file_whose_nodes_are_too_small_is_refused_naming_stage_ask_and_node(
    tmp_path,
):
    """The issue's case: 4-vCPU rollout nodes and generators that ask for 8 CPUs each."""
    from opdflow.cli import main

    path = _write(tmp_path, TOO_SMALL)
    args = ["validate", f"{PIPELINES}/dapo_math.py:student_7b", "--cluster-yaml", str(path)]
    steer = ["--set", 'resources.generator.resources={"rollout": 1}']
    res = CliRunner().invoke(main, args + steer)
    assert res.exit_code == 2
    assert (
        f"{path}: resources.generator asks 8 CPU, 1 GPU, 1 rollout per actor, more than any "
        "node has: the largest node with rollout, rollout[0] (g6e.xlarge), has 4 CPU, 1 GPU, "
        "1 rollout" in res.output
    ), res.output
    one_group = 'resources.placement.groups=[["learner","rescorer","teacher","evaluator"]]'
    smaller = ["--set", "resources.generator.num_cpus=4", "--set", one_group]
    ok = CliRunner().invoke(main, [*args, *smaller, *steer])  # 4 CPUs, not packed: one a node
    assert ok.exit_code == 0 and "rollout[3] (g6e.xlarge): generator[3]" in ok.output, ok.output
    res = CliRunner().invoke(main, [*args[:2], "--cluster-yaml", str(CLUSTER / "aws-gpu.yaml")])
    assert res.exit_code == 0 and "valid and fits " in res.output, res.output


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            ("CPU: 4, GPU: 1, rollout", "rollout"),
            r"'rollout' \(g6e.xlarge\) does not state its CPU and GPU",
        ),
        (("max_workers: 9", "max_workers: 1"), r"needs 2 worker nodes, but max_workers is 1"),
    ],
)
def test_what_a_cluster_file_must_state_and_allow(tmp_path, edit, match):
    from opdflow.cluster.clusterfile import fit_cluster_file, load_cluster_file
    from opdflow.config.loader import load_pipeline
    from opdflow.errors import ConfigError

    cfg = load_pipeline(
        f"{PIPELINES}/tiny_cpu.py", ['resources.generator.resources={"rollout": 1}']
    )
    with pytest.raises(ConfigError, match=match):
        fit_cluster_file(cfg, load_cluster_file(_write(tmp_path, TOO_SMALL.replace(*edit))))


def test_local_and_kuberay_files_read_their_ray_start_resources(tmp_path):
    from opdflow.cluster.clusterfile import load_cluster_file
    from opdflow.errors import ConfigError

    local = load_cluster_file(CLUSTER / "local-onprem.yaml")
    nodes, names = local.nodes()
    assert names == ["head (head)", "worker[0]", "worker[1]", "worker[2]"]
    assert nodes[0] == {"CPU": 16, "GPU": 0, "learner": 1}
    assert nodes[1] == {"CPU": 16, "GPU": 0, "rollout": 1}
    kuberay = load_cluster_file(CLUSTER / "kuberay-raycluster.yaml")
    nodes, names = kuberay.nodes()
    assert nodes[0] == {"CPU": 0, "GPU": 0} and names[1] == "learner[0]"
    assert nodes[1] == {"CPU": 96, "GPU": 8, "learner": 1}
    assert nodes[2] == {"CPU": 8, "GPU": 1, "rollout": 1} and kuberay.max_workers == 9
    text = (CLUSTER / "local-onprem.yaml").read_text().replace("--num-cpus=16 --num-gpus=0 ", "")
    with pytest.raises(ConfigError, match=r"head's `ray start` line does not say --num-cpus"):
        load_cluster_file(_write(tmp_path, text))
