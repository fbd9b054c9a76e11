"""A Ray cluster of N nodes on this machine, each in its own network namespace (root only).

    python cluster/netcluster.py up 3                         # as root: head + 2 workers
    eval "$(python cluster/netcluster.py env)"                # RAY_ADDRESS and the token for opdflow
    opdflow submit pipelines/tiny_cpu.py --storage "$OPDFLOW_STORAGE" ...
    python cluster/netcluster.py status                       # Ray's node table
    python cluster/netcluster.py down                         # every process killed, links deleted

The nodes: node 1 (the head) and node 2 advertise {"learner": 1}, nodes 3.. {"rollout": 1}
(override with --resources, one JSON per node). Shared storage (runs, checkpoints, model
cache) is BASE/shared on every node; `down` keeps it unless --purge. The implementation is
opdflow/testbed/netcluster.py, the same class the tests use; docs/MANY_MACHINES.md says more.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's opdflow
from opdflow.testbed.netcluster import STATE_ROOT, NetCluster, NodeSpec, layout
from opdflow.testbed.netns import unavailable


def specs(n: int, cpus: float, resources: list[str]) -> list[NodeSpec]:
    """N nodes: the given resources per node, else netcluster.layout's."""
    if not resources:
        return layout(n, cpus)
    if len(resources) != n:
        sys.exit(f"--resources given {len(resources)} times for {n} nodes: give it once per node")
    return [NodeSpec("head" if i == 0 else f"node{i + 1}", cpus, json.loads(r))
            for i, r in enumerate(resources)]  # fmt: skip


def find_base(given: str | None) -> Path:
    """The cluster's base directory: the one given, or the only one on this machine."""
    if given:
        return Path(given)
    found = sorted(p.parent for p in STATE_ROOT.glob("opdnet-*/state.json"))
    if len(found) != 1:
        listed = ", ".join(map(str, found)) or "none"
        sys.exit(f"{len(found)} clusters found under {STATE_ROOT} ({listed}): name one as BASE")
    return found[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start N nodes")
    up.add_argument("n", type=int, nargs="?", default=3)
    up.add_argument("--cpus", type=float, default=2.0, help="logical CPUs per node")
    up.add_argument("--resources", action="append", default=[], metavar="JSON")
    up.add_argument("--base", default=None, help="state, token, logs, shared storage")
    for name in ("down", "status", "env"):
        p = sub.add_parser(name)
        p.add_argument("base", nargs="?", default=None)
        if name == "down":
            p.add_argument("--purge", action="store_true", help="also delete the shared storage")
    args = ap.parse_args()

    if args.cmd == "up":
        if (why := unavailable()) is not None:
            sys.exit(f"cannot start a namespaced cluster here: {why}")
        c = NetCluster(Path(args.base) if args.base else None, owned=False)
        c.start(specs(args.n, args.cpus, args.resources))
        for node in c.nodes:
            print(f"node {node.index} {node.ip} {node.ns.name} {node.spec.resources}")
        print(f"dashboard (Jobs API): {c.dashboard}\nshared storage: {c.shared}")
        print(f'next: eval "$(python {sys.argv[0]} env {c.base})"; then opdflow submit ... '
              f'--storage {c.shared}/runs')  # fmt: skip
        return
    base = find_base(args.base)
    c = NetCluster.load(base)
    if args.cmd == "env":
        for key, value in {**c.client_env(), "OPDFLOW_STORAGE": f"{c.shared}/runs"}.items():
            print(f"export {key}={value}")
    elif args.cmd == "status":
        for n in c.ray_nodes():
            print(n["node_ip"], n["state"], json.dumps(n["resources_total"]))
    else:
        c.stop()
        if args.purge:
            shutil.rmtree(base, ignore_errors=True)
        print(f"stopped; shared storage kept in {c.shared}" if not args.purge else "stopped")


if __name__ == "__main__":
    main()
