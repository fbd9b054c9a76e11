"""`opdflow validate` and `opdflow run`: a pipeline file checked, then run.

validate loads and checks the config without starting Ray (and, given a cluster, places
every actor on it); run trains on an embedded local Ray cluster or RAY_ADDRESS.
"""

from __future__ import annotations

import click

from opdflow.commands.options import pipeline_argument, set_option, steps_option


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
def validate(
    pipeline: str, overrides: tuple[str, ...], cluster: str | None, cluster_yaml: str | None
) -> None:
    """Load and validate PIPELINE (path.py[:function]) without starting Ray.

    Checks the config, not the files it names (run checks those when it starts)."""
    import json

    from opdflow.config.loader import load_pipeline

    if cluster and cluster_yaml:
        raise click.UsageError("give either --cluster (a described cluster) or --cluster-yaml")
    cfg = load_pipeline(pipeline, list(overrides))
    click.echo(json.dumps(cfg.to_dict(), indent=2))
    where: dict[str, str] = {}
    if cluster:
        from opdflow.runtime.placement import fit, parse_cluster

        where = {a: f"node {n}" for a, n in fit(cfg, parse_cluster(cluster)).items()}
    elif cluster_yaml:
        from opdflow.runtime.clusterfile import fit_cluster_file, load_cluster_file

        where = fit_cluster_file(cfg, load_cluster_file(cluster_yaml))
    for node in dict.fromkeys(sorted(where.values(), key=_node_order)):
        actors = ", ".join(a for a, n in where.items() if n == node)
        click.echo(f"{node}: {actors}", err=True)
    fits = f" and fits {cluster or cluster_yaml}" if where else ""
    click.secho(f"{pipeline}: valid{fits}", fg="green", err=True)


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
