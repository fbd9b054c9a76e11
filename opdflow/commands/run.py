"""`opdflow validate` and `opdflow run`: a pipeline file checked, then run.

validate loads and checks the config without starting Ray (and, given a cluster, places
every actor on it; given GPU memory, plans every GPU actor's, opdflow/memory); run trains
on an embedded local Ray cluster or RAY_ADDRESS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from opdflow.commands.options import pipeline_argument, set_option, steps_option

if TYPE_CHECKING:
    from opdflow.config import PipelineConfig


@click.command()
@pipeline_argument
@set_option
@click.option(
    "--cluster",
    default=None,
    metavar="NxG[:C]",
    help="Also place every actor on N nodes of G GPUs (and C CPUs) each, e.g. 2x4:72.",
)
@click.option(
    "--cluster-yaml",
    default=None,
    metavar="FILE",
    help="Also place every actor on the nodes a Ray cluster launcher YAML or KubeRay manifest "
    "declares (CPUs, GPUs, custom resources, max workers), e.g. cluster/aws-gpu.yaml.",
)
@click.option(
    "--gpu-mem",
    type=float,
    default=None,
    metavar="GB",
    help="Also plan every GPU actor's peak memory by part on GPUs of GB GB (1e9 bytes) each, "
    "e.g. 96, and refuse a pipeline that does not fit (with --cluster-yaml: instead of the "
    "GPU memory the file's instance or accelerator types give).",
)
def validate(
    pipeline: str,
    overrides: tuple[str, ...],
    cluster: str | None,
    cluster_yaml: str | None,
    gpu_mem: float | None,
) -> None:
    """Load and validate PIPELINE (path.py[:function]) without starting Ray.

    Checks the config, not the files it names (run checks those when it starts). Given GPU
    memory (--gpu-mem, or a cluster file naming its GPUs), also plans every GPU actor's
    peak memory by part and refuses a pipeline that does not fit."""
    import json

    from opdflow.config.loader import load_pipeline

    if cluster and cluster_yaml:
        raise click.UsageError("give either --cluster (a described cluster) or --cluster-yaml")
    cfg = load_pipeline(pipeline, list(overrides))
    click.echo(json.dumps(cfg.to_dict(), indent=2))
    where: dict[str, str] = {}
    if cluster:
        from opdflow.cluster.placement import fit, parse_cluster

        where = {a: f"node {n}" for a, n in fit(cfg, parse_cluster(cluster)).items()}
    elif cluster_yaml:
        from opdflow.cluster.clusterfile import fit_cluster_file, load_cluster_file

        where = fit_cluster_file(cfg, load_cluster_file(cluster_yaml))
    for node in dict.fromkeys(sorted(where.values(), key=_node_order)):
        actors = ", ".join(a for a, n in where.items() if n == node)
        click.echo(f"{node}: {actors}", err=True)
    memory = _memory_plan(cfg, cluster_yaml, where, gpu_mem)
    fits = f" and fits {cluster or cluster_yaml}" if where else ""
    click.secho(f"{pipeline}: valid{fits}{memory}", fg="green", err=True)


def _memory_plan(
    cfg: PipelineConfig, cluster_yaml: str | None, where: dict[str, str], gpu_mem: float | None
) -> str:
    """Print the memory plan where a GPU memory is known (--gpu-mem, or the cluster file's
    GPU types); raise its ConfigError if an actor does not fit. What to add to the verdict."""
    from opdflow.config import STAGES

    if not any(getattr(cfg.resources, s).num_gpus > 0 for s in STAGES):
        return " (no GPU actors: no memory plan)" if gpu_mem else ""
    from opdflow.memory.actors import plan_pipeline
    from opdflow.memory.plan import uniform

    if gpu_mem is not None:
        gpu_of = uniform(gpu_mem)
    elif cluster_yaml:
        from opdflow.memory.gpus import placed_gpus

        gpu_of = placed_gpus(cluster_yaml, where)
        if not any(gpu_of(a) for a in where):
            click.echo(
                f"memory plan: {cluster_yaml} names no GPU type the plan knows (an instance "
                "type, a GPU node selector or an accelerator_type resource): give --gpu-mem GB",
                err=True,
            )
            return ""
    else:
        return ""
    plan = plan_pipeline(cfg, gpu_of, log=lambda msg: click.echo(msg, err=True))
    click.echo("\n".join(plan.lines()), err=True)
    plan.check()
    return ", and its memory plan fits"


def _node_order(label: str) -> tuple:
    """'node 10' after 'node 9'; 'rollout[10]' after 'rollout[9]'."""
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label))


@click.command()
@pipeline_argument
@set_option
@steps_option
@click.option(
    "--run-dir", type=click.Path(), default=None, help="Run directory (default runs/NAME-TIME)."
)
@click.option(
    "--resume", type=click.Path(), default=None, help="Continue RUN_DIR from its last checkpoint."
)
@click.option(
    "--log",
    "sinks",
    default=None,
    metavar="SINKS",
    help="Trackers besides metrics.parquet, comma-separated: tensorboard,wandb,mlflow.",
)
def run(
    pipeline: str,
    overrides: tuple[str, ...],
    steps: int | None,
    run_dir: str | None,
    resume: str | None,
    sinks: str | None,
) -> None:
    """Run PIPELINE: on-policy distillation on an embedded local Ray cluster or RAY_ADDRESS."""
    import json

    from opdflow.config.loader import load_pipeline

    extra = list(overrides) + ([f"train.steps={steps}"] if steps is not None else [])
    if sinks is not None:
        extra.append("log.sinks=" + json.dumps([s.strip() for s in sinks.split(",") if s.strip()]))
    cfg = load_pipeline(pipeline, extra)
    from opdflow.commands.console import run_with_progress

    if resume and run_dir:
        raise click.UsageError("give either --run-dir (a new run) or --resume (an existing one)")
    run_with_progress(cfg, run_dir, resume)
