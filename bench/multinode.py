"""Cross-node figures on a namespaced 3-node cluster (opdflow.testbed.netcluster; root only).

    python bench/multinode.py [--mb 100] [--steps 8] [--demo-steps 30] [--demo-repeats 2]
                              [--out FILE]

1. Weights fetched and loaded on another node vs on the same node, per transport: runs
   of the dapo_math CPU variant (k = 0: every step publishes a version) with a random
   Qwen2-shaped student of about --mb MB in BF16, its 2 learner ranks on nodes 1 and 2,
   the generator on node 3; the rescorer beside learner rank 0 (node 1, which publishes)
   in one run and on node 2 in another (where no other consumer has pulled the version
   into the node's object store first, as the generator does on node 3). The rescorer's
   "fetch" spans (spans.parquet:
   from the WeightsRef to the weights in its model, as the run records them) are the
   figure: it fetches once the batch is generated, so the version is complete by then
   and the span is the transfer and the load alone (a generator's fetch also waits for
   the version the learner is still putting). Median over versions after the first, as a
   ratio to a single-thread memcpy (np.copyto) of the same bytes, measured here before
   and after the runs (median of 7 each).
2. Updates/hour of the demo (pipelines/tiny_cpu.py, k = 2, 2 learner ranks) submitted to
   the 3-node cluster (ranks on nodes 1 and 2, generator on node 3) vs the same config
   run on one node (`opdflow run`, its embedded cluster), --demo-steps steps each,
   --demo-repeats times on each side, alternated; the ratio is of the medians.

Nodes: 1 {"learner": 1, "near": 1}, 2 {"learner": 1, "far": 1}, 3 {"rollout": 1}.

The nodes share this machine's cores: a second and third node add no compute, so (2)
measures what spreading a run over nodes costs, not what more machines buy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's opdflow, as the nodes run it

from opdflow.testbed.netcluster import SPANNING, NetCluster, NodeSpec  # noqa: E402
from opdflow.testbed.netns import unavailable  # noqa: E402

ACROSS_NODES = [x for kv in SPANNING for x in ("--set", kv)]
NODES = [
    NodeSpec("head", 2, {"learner": 1, "near": 1}),
    NodeSpec("node2", 2, {"learner": 1, "far": 1}),
    NodeSpec("node3", 2, {"rollout": 1}),
]
"""layout(3) with "near" (node 1) and "far" (node 2) to place the rescorer."""

TRANSPORTS = ("object_store", "collective")
SIDES = {"same_node": "near", "other_node": "far"}
"""Where the rescorer runs: beside learner rank 0 (node 1) or on node 2."""


def build_student(out: Path, mb: float, tokenizer: Path) -> int:
    """A random Qwen2-shaped model of about `mb` MB in BF16 (hidden 1024), saved with the
    tiny tokenizer; its BF16 bytes."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    hidden, inter = 1024, 2816
    layers = max(1, round(mb * 1e6 / 2 / (4 * hidden * hidden + 3 * hidden * inter)))
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
        max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    shutil.copytree(tokenizer, out, dirs_exist_ok=True)
    return sum(p.numel() for p in model.parameters()) * 2


def memcpy_s(nbytes: int, repeats: int = 7) -> float:
    """Median seconds of a single-thread np.copyto of `nbytes` between buffers faulted in."""
    src = np.full(nbytes, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def opdflow(args: list[str], env: dict[str, str], timeout_s: float = 3600) -> str:
    """`opdflow ARGS` in a child process; its output (raises with it on failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "opdflow.cli", *args], env=env, capture_output=True, text=True,
        timeout=timeout_s,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"opdflow {args[0]} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout + proc.stderr


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def rescorer_fetches(run: Path) -> dict:
    """The rescorer's fetch-span seconds after the first version, and whether it ran on
    learner rank 0's node (which publishes)."""
    from opdflow.record.rundir import read_table

    rank0 = events(run, "learner_ranks")[0]["ranks"][0]["node"]
    node = events(run, "placement")[0]["actors"]["rescorer"]
    spans = read_table(run / "spans.parquet")
    seconds = [s["end_s"] - s["start_s"] for s in spans
               if s["stage"] == "fetch" and s["actor"] == "rescorer" and s["version"] > 1]  # fmt: skip
    return {"seconds": seconds, "rescorer_node": node, "publisher_node": rank0,
            "same_node": node == rank0}  # fmt: skip


def weights_figures(cluster: NetCluster, env: dict, mb: float, steps: int) -> dict:
    """Part 1: per transport, the rescorer's fetch + load beside the publisher and on
    another node, in seconds and as a ratio to a memcpy of the same bytes."""
    from opdflow.config import TaskSpec, TinyModelSpec
    from opdflow.testbed.zoo import ensure_tiny

    tiny = ensure_tiny(TinyModelSpec(), TaskSpec())  # the tokenizer and prompts (cached)
    storage, models = cluster.shared / "runs", cluster.shared / "models"
    nbytes = build_student(models / "student", mb, tiny.tokenizer)
    memcpy = [memcpy_s(nbytes)]
    for name in ("train", "heldout"):  # on the shared storage: every node reads them
        (models / f"{name}.parquet").write_bytes(Path(getattr(tiny, name)).read_bytes())
    data = [x for n in ("train", "heldout") for x in ("--set", f"data.{n}={models / n}.parquet")]
    cpu = [x for s in ("generator", "learner", "rescorer", "teacher", "evaluator")
           for kv in ("num_gpus=0", "num_cpus=0.25", "torch_threads=1")
           for x in ("--set", f"resources.{s}.{kv}")]  # fmt: skip
    out: dict = {"weights_bytes": nbytes}
    for transport, (side, there) in itertools.product(TRANSPORTS, SIDES.items()):
        run = storage / f"weights-{transport}-{side}"
        opdflow([
            "submit", f"{ROOT}/pipelines/dapo_math.py:student_1p5b", "--steps", str(steps),
            "--set", f"models.student={models / 'student'}",
            "--set", f"models.teacher={models / 'student'}", *data,
            "--set", "data.prompts_per_step=2", "--set", "data.responses_per_prompt=4",
            "--set", "data.max_prompt_tokens=16", "--set", "engine.kind=torch",
            "--set", "engine.replicas=1", "--set", "engine.max_new_tokens=8",
            "--set", "train.micro_batch_tokens=256", "--set", "eval.prompts=4",
            "--set", "eval.every=1", "--set", "eval.batch_prompts=4",
            "--set", "reliability.checkpoint_every=0", "--set", "reliability.startup_timeout_s=900",
            "--set", "resources.placement.groups=[]", "--set", f"weights.transport={transport}",
            *cpu, *ACROSS_NODES, "--set", f'resources.rescorer.resources={{"{there}": 1}}',
            "--storage", str(storage), "--run-dir", run.name, "--wait",
        ], env)  # fmt: skip
        out.setdefault(transport, {})[side] = rescorer_fetches(run)
    memcpy.append(memcpy_s(nbytes))
    out["memcpy_s"] = memcpy
    for transport, side in itertools.product(TRANSPORTS, SIDES):
        r = out[transport][side]
        r["ratio"] = statistics.median(r["seconds"]) / statistics.median(memcpy)
    return out


def demo_figures(cluster: NetCluster, env: dict, steps: int, repeats: int) -> dict:
    """Part 2: the demo's updates/hour on the 3 nodes and on one, alternated."""
    storage = cluster.shared / "runs"
    demo = ["--steps", str(steps), "--set", "resources.learner.workers=2"]
    local = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    local["PYTHONPATH"] = str(ROOT)
    uph: dict[str, list[float]] = {"three_nodes": [], "one_node": []}
    for i in range(repeats):  # alternated: a crowded machine drifts
        name = f"demo-{i}"
        opdflow(["submit", f"{ROOT}/pipelines/tiny_cpu.py", *demo, *ACROSS_NODES,
                 "--storage", str(storage), "--run-dir", name, "--wait"], env)  # fmt: skip
        summary = json.loads((storage / name / "summary.json").read_text())
        uph["three_nodes"].append(summary["updates_per_hour"])
        with tempfile.TemporaryDirectory(prefix="opd-bench-") as tmp:
            opdflow(["run", f"{ROOT}/pipelines/tiny_cpu.py", *demo, "--run-dir", f"{tmp}/run"],
                    local)  # fmt: skip
            summary = json.loads(Path(tmp, "run", "summary.json").read_text())
        uph["one_node"].append(summary["updates_per_hour"])
    three, one = statistics.median(uph["three_nodes"]), statistics.median(uph["one_node"])
    return {**uph, "ratio": three / one}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=float, default=100.0, help="student size in BF16 (MB)")
    ap.add_argument("--steps", type=int, default=8, help="steps of each weights run")
    ap.add_argument("--demo-steps", type=int, default=30, help="steps of each demo run")
    ap.add_argument("--demo-repeats", type=int, default=2, help="demo runs on each side")
    ap.add_argument("--parts", default="weights,demo", help="weights, demo or both")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if (why := unavailable()) is not None:
        sys.exit(f"cannot start a namespaced cluster here: {why}")
    parts = {p.strip() for p in args.parts.split(",")}
    results: dict = {"machine": os.uname().nodename, "cpus": os.cpu_count(),
                     "load_average_start": os.getloadavg()}  # fmt: skip
    with NetCluster() as cluster:
        cluster.start(NODES)
        env = {**os.environ, **cluster.client_env(), "PYTHONPATH": str(ROOT)}
        if "weights" in parts:
            results["weights"] = weights_figures(cluster, env, args.mb, args.steps)
            save(results, args.out)
        if "demo" in parts:
            results["updates_per_hour"] = demo_figures(
                cluster, env, args.demo_steps, args.demo_repeats
            )
    results["load_average_end"] = os.getloadavg()
    save(results, args.out)
    print_results(results)


def save(results: dict, out: str | None) -> None:
    """Write what is measured so far (a later part may fail on a crowded machine)."""
    if out:
        Path(out).write_text(json.dumps(results, indent=2))


def print_results(r: dict) -> None:
    if "weights" in r:
        w = r["weights"]
        mb, copy = w["weights_bytes"] / 1e6, statistics.median(w["memcpy_s"])
        print(f"weights: {mb:.0f} MB BF16; memcpy {copy * 1e3:.1f} ms ({mb / 1e3 / copy:.1f} GB/s)")
        print("rescorer fetch + load, x memcpy: on the publisher's node / on another node")
        for t in TRANSPORTS:
            same, other = w[t]["same_node"], w[t]["other_node"]
            print(f"{t:<14} {same['ratio']:6.2f}x (on {same['rescorer_node']})  "
                  f"{other['ratio']:6.2f}x (on {other['rescorer_node']}); "
                  f"publisher on {same['publisher_node']} / {other['publisher_node']}")  # fmt: skip
    if "updates_per_hour" in r:
        u = r["updates_per_hour"]
        print(f"demo updates/hour: 3 nodes {[round(x) for x in u['three_nodes']]}, 1 node "
              f"{[round(x) for x in u['one_node']]}, ratio of medians {u['ratio']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
