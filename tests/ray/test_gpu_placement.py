"""The GPU pipelines' placement groups on a simulated Ray cluster of two 4-GPU nodes.

ray.cluster_utils.Cluster starts two raylets on loopback that advertise 4 logical GPUs
and 72 CPUs each (no GPU needed: Ray schedules logical resources). Placement.reserve, the
code every run reserves its groups with (driver.wiring.reserve_placement), must place each
pipeline's groups, and opdflow.cluster.placement.fit must agree with Ray on which stages
share a node; half the cluster must not hold them.
"""

from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util import placement_group, placement_group_table, remove_placement_group

from opdflow.cluster.placement import Placement, bundle, fit, grouped_actors, parse_cluster
from opdflow.config.loader import load_pipeline

FILE = Path(__file__).resolve().parents[2] / "pipelines" / "dapo_math.py"
NODE = {"num_cpus": 72, "num_gpus": 4, "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def gpu_cluster(_ray_session):
    from ray._private import ray_constants

    if ray.is_initialized():  # another module's cluster: this one needs its own
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=NODE)
    cluster.add_node(**NODE)
    # ray.init rewrites a 127.0.0.1 address to the machine's outward IP unless Ray thinks
    # it runs on a laptop; keep the driver on loopback like the nodes
    laptop, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        ray.init(address=cluster.address)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = laptop
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _node_of(pg) -> list[str]:
    return list(placement_group_table(pg)["bundles_to_node_id"].values())


@pytest.mark.parametrize("name", ["student_7b", "student_1p5b"])
def test_pipeline_groups_are_placed_as_fit_predicts(gpu_cluster, name):
    cfg = load_pipeline(f"{FILE}:{name}")
    predicted = fit(cfg, parse_cluster("2x4:72"))
    placement = Placement(cfg.resources, grouped_actors(cfg))
    try:
        assert placement.reserve(timeout_s=30) is None
        for names, pg in zip(placement.actors, placement.pgs):
            nodes = _node_of(pg)
            assert len(set(nodes)) == 1  # STRICT_PACK: each group on one node
            assert len({predicted[a] for a in names}) == 1
        if len(placement.pgs) == 2:  # the two groups on different nodes, as predicted
            assert _node_of(placement.pgs[0])[0] != _node_of(placement.pgs[1])[0]
        # the actors outside any group get what is left: one PACK group of their bundles
        grouped = {a for names in placement.actors for a in names}
        rest = [a for a in predicted if a not in grouped]
        if rest:
            extra = [bundle(getattr(cfg.resources, a.split("[")[0])) for a in rest]
            pg = placement_group(extra, strategy="PACK")
            try:
                assert ray.get(pg.ready(), timeout=30)
            finally:
                remove_placement_group(pg)
    finally:
        placement.release()


def test_more_gpus_than_the_cluster_has_are_not_placed(gpu_cluster):
    cfg = load_pipeline(f"{FILE}:student_7b", ["engine.replicas=5"])  # 4 + 5 GPUs > 8
    placement = Placement(cfg.resources, grouped_actors(cfg))
    try:
        missing = placement.reserve(timeout_s=3)
    finally:
        placement.release()
    assert missing and "generator (STRICT_PACK)" in missing
