"""Running a pipeline on a remote Ray cluster through the Ray Jobs API.

`opdflow submit` ships the pipeline file's directory as the job's working_dir and runs
`python -m opdflow.commands.jobs PIPELINE ...` on the cluster, which is `opdflow run` plus
one machine-readable summary line that `submit --wait` reads back from the job's logs.
The address is explicit (`--address` or RAY_ADDRESS): submitting never guesses a cluster.
Token authentication follows Ray's own variables (RAY_AUTH_MODE, RAY_AUTH_TOKEN[_PATH]).
Where the run lives (`--storage`, `--resume`, the checkpoint rule) is storage.py's; the job
prints its run directory and, when a check refuses it, one `error:` line that `status`
shows.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from opdflow.cluster.connection import sync_auth
from opdflow.commands.options import (
    address_option,
    pipeline_argument,
    set_option,
    steps_option,
    token_option,
)

SUMMARY_MARK = "OPDFLOW_SUMMARY_JSON: "
"""Prefix of the one log line that carries the run summary back to `submit --wait`."""
RUN_DIR_MARK = "OPDFLOW_RUN_DIR: "
"""Prefix of the log line in which a job says where its run directory is."""
ERROR_MARK = "error: "
"""Prefix of the one line a job that was refused or failed prints with the reason."""
TAIL_LINES = 40
"""Lines of a failed job's logs shown with the error."""


def job_client(address: str | None, token: str | None = None) -> Any:
    """A JobSubmissionClient for an explicit address, or a one-line error saying what to fix."""
    if not address:
        raise click.UsageError(
            "no cluster address: pass --address http://HEAD:8265 or set RAY_ADDRESS "
            "(for a local run without a cluster use `opdflow run`)"
        )
    if token:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    if "://" not in address and not address.startswith("ray://"):
        address = f"http://{address}"
    sync_auth()
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = (
            "check the address is the dashboard's HTTP address (port 8265 by default), the "
            "cluster runs with --include-dashboard=true and the dashboard host is reachable"
        )
        if "auth" in text.lower() or "token" in text.lower():
            hint = (
                "the cluster uses token authentication: set RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN (or pass --token)"
            )
        raise click.ClickException(
            f"cannot reach the Ray Jobs API at {address}: {text}; {hint}"
        ) from None


def runtime_env(
    pipeline_dir: Path, ship_opdflow: bool = False, pip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The job's runtime environment: the pipeline's directory, optionally opdflow and pip pkgs."""
    env: dict[str, Any] = {
        "working_dir": str(pipeline_dir),
        "excludes": ["runs/", ".git/", "__pycache__/", "*.parquet", ".venv/"],
    }
    if ship_opdflow:
        import opdflow

        env["py_modules"] = [str(Path(opdflow.__file__).parent)]
    if pip:
        env["pip"] = list(pip)
    return env


def entrypoint(
    pipeline_name: str,
    overrides: tuple[str, ...],
    run_dir: str | None,
    resume: str | None = None,
    storage: str | None = None,
) -> str:
    """The shell command the job runs on the cluster (inside the working_dir)."""
    argv = ["python", "-m", "opdflow.commands.jobs", pipeline_name]
    for item in overrides:
        argv += ["--set", item]
    for flag, value in (("--run-dir", run_dir), ("--resume", resume), ("--storage", storage)):
        if value:
            argv += [flag, value]
    return shlex.join(argv)


def summary_from_logs(logs: str) -> dict | None:
    """The run summary a finished job printed, or None."""
    line = _marked(logs, SUMMARY_MARK)
    return json.loads(line) if line is not None else None


def _marked(logs: str, mark: str) -> str | None:
    """The rest of the last log line that starts with `mark`, or None."""
    for line in reversed(logs.splitlines()):
        if line.startswith(mark):
            return line[len(mark) :].strip()
    return None


def run_dir_of(client: Any, job_id: str, logs: str | None = None) -> str | None:
    """Where a job's run directory is: what submit recorded (--storage, --run-dir), else
    what the job printed."""
    info = client.get_job_info(job_id)
    known = (info.metadata or {}).get("opdflow_run_dir")
    if known:
        return known
    return _marked(logs if logs is not None else client.get_job_logs(job_id), RUN_DIR_MARK)


def error_of(logs: str) -> str | None:
    """The one line a refused or failed job printed with its reason ("error: ..."), or None."""
    return _marked(logs, ERROR_MARK)


def _tail(logs: str, n: int = TAIL_LINES) -> str:
    return "\n".join(logs.rstrip().splitlines()[-n:])


def _follow_logs(client: Any, job_id: str, out: Any) -> None:
    import asyncio

    async def go() -> None:
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    asyncio.run(go())


def wait_for_job(
    client: Any, job_id: str, follow: bool = False, poll_s: float = 1.0
) -> tuple[str, str]:
    """Wait until the job is terminal; returns (status, full logs)."""
    if follow:
        _follow_logs(client, job_id, sys.stderr)
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return str(status), client.get_job_logs(job_id)
        time.sleep(poll_s)


@click.command()
@pipeline_argument
@set_option
@steps_option
@address_option
@token_option
@click.option(
    "--wait/--no-wait",
    default=True,
    help="Follow the job to its end and print its summary (default), or return at once.",
)
@click.option(
    "--storage",
    default=None,
    metavar="PATH",
    help="Storage every node mounts (absolute): the run directory and its checkpoints go under "
    "it, PATH/NAME-TIME (default: runs/NAME-TIME inside the job's temporary working_dir).",
)
@click.option(
    "--run-dir",
    default=None,
    help="Run directory on the cluster (relative: under --storage).",
)
@click.option(
    "--resume",
    default=None,
    metavar="RUN_DIR",
    help="Continue this run from its last checkpoint in a new job (relative: under --storage).",
)
@click.option(
    "--ship-opdflow",
    is_flag=True,
    help="Upload this machine's opdflow package (py_modules) instead of the cluster's.",
)
@click.option("--pip", multiple=True, metavar="PKG", help="Extra pip package for the job.")
def submit(
    pipeline: str,
    overrides: tuple[str, ...],
    steps: int | None,
    address: str | None,
    token: str | None,
    wait: bool,
    storage: str | None,
    run_dir: str | None,
    resume: str | None,
    ship_opdflow: bool,
    pip: tuple[str, ...],
) -> None:
    """Submit PIPELINE (path.py[:function]) as a Ray job; prints the job id (and where its
    run directory is, on stderr)."""
    from opdflow.commands.storage import check_checkpoint_dir, run_dir_for
    from opdflow.config.loader import load_pipeline

    if resume and run_dir:
        raise click.UsageError("give either --run-dir (a new run) or --resume (an existing one)")
    if resume and not storage and not Path(resume).is_absolute():
        raise click.UsageError(
            f"--resume {resume}: a relative path is looked up in the job's working directory, a "
            "fresh copy on the cluster; give --storage (the storage the run is under) or an "
            "absolute path"
        )
    overrides = overrides + ((f"train.steps={steps}",) if steps is not None else ())
    cfg = load_pipeline(pipeline, list(overrides))  # fail here, not on the cluster
    where = run_dir_for(cfg, storage, run_dir, resume)
    check_checkpoint_dir(cfg, where)
    path_text, _, func = pipeline.partition(":")
    path = Path(path_text).resolve()
    client = job_client(address, token)
    name = path.name + (f":{func}" if func else "")
    job_id = client.submit_job(
        entrypoint=entrypoint(
            name, overrides, None if resume else where, where if resume else None, storage
        ),
        runtime_env=runtime_env(path.parent, ship_opdflow, pip),
        submission_id=f"opdflow-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
        metadata={
            "opdflow_pipeline": pipeline,
            "opdflow_name": cfg.name,
            **({"opdflow_run_dir": where} if where else {}),
        },
    )
    click.echo(job_id)
    if where:
        click.echo(f"run directory: {where}", err=True)
    if not wait:
        return
    status, logs = wait_for_job(client, job_id, follow=True)
    _report_end(job_id, status, logs, client)


def _report_end(job_id: str, status: str, logs: str, client: Any) -> None:
    if status != "SUCCEEDED":
        line = error_of(logs)
        message = ERROR_MARK + line if line else client.get_job_info(job_id).message or ""
        raise click.ClickException(
            f"job {job_id} {status}: {message}\n--- last {TAIL_LINES} lines of its logs ---\n"
            f"{_tail(logs)}"
        )
    summary = summary_from_logs(logs)
    if summary is None:
        raise click.ClickException(f"job {job_id} SUCCEEDED but printed no run summary")
    from opdflow.commands.console import print_summary

    print_summary(summary)


@click.command()
@click.argument("job_id")
@address_option
@token_option
def status(job_id: str, address: str | None, token: str | None) -> None:
    """Print the status of a submitted job (and its summary once it succeeded)."""
    client = job_client(address, token)
    try:
        info = client.get_job_info(job_id)
    except RuntimeError as exc:
        raise click.ClickException(f"job {job_id}: {exc}") from exc
    logs = client.get_job_logs(job_id)
    line = error_of(logs) if str(info.status) == "FAILED" else None
    if line:
        click.echo(f"{job_id}: {info.status}: {ERROR_MARK}{line}")
    else:
        click.echo(f"{job_id}: {info.status}" + (f" ({info.message})" if info.message else ""))
    if str(info.status) == "SUCCEEDED":
        summary = summary_from_logs(logs)
        if summary is not None:
            click.echo(
                json.dumps({k: v for k, v in summary.items() if k != "trained_steps_record"})
            )
    where = run_dir_of(client, job_id, logs)
    click.echo(f"run directory: {where or 'not created yet'}")
    if str(info.status) == "FAILED":
        if not line:
            click.echo(_tail(logs), err=True)
        sys.exit(1)


@click.command()
@click.argument("job_id")
@address_option
@token_option
@click.option("--follow", "-f", is_flag=True, help="Stream new lines until the job ends.")
def logs(job_id: str, address: str | None, token: str | None, follow: bool) -> None:
    """Print a submitted job's logs."""
    client = job_client(address, token)
    try:
        where = run_dir_of(client, job_id)
        click.echo(f"run directory: {where or 'not created yet'}", err=True)
        if follow:
            _follow_logs(client, job_id, sys.stdout)
        else:
            click.echo(client.get_job_logs(job_id), nl=False)
    except RuntimeError as exc:
        raise click.ClickException(f"job {job_id}: {exc}") from exc


@click.command()
@click.argument("job_id")
@address_option
@token_option
def stop(job_id: str, address: str | None, token: str | None) -> None:
    """Stop a submitted job."""
    client = job_client(address, token)
    try:
        stopped = client.stop_job(job_id)
    except RuntimeError as exc:
        raise click.ClickException(f"job {job_id}: {exc}") from exc
    click.echo(f"{job_id}: {'stop requested' if stopped else 'already finished'}")


@click.command(name="job-entry", hidden=True)
@pipeline_argument
@set_option
@click.option("--run-dir", default=None)
@click.option("--resume", default=None)
@click.option("--storage", default=None)
def job_entry(
    pipeline: str,
    overrides: tuple[str, ...],
    run_dir: str | None,
    resume: str | None,
    storage: str | None,
) -> None:
    """What a submitted job runs on the cluster: `opdflow run` (or --resume), its run
    directory and summary as marked lines, a refusal as one `error:` line (exit 2)."""
    from opdflow.commands.console import run_with_progress
    from opdflow.config.loader import load_pipeline
    from opdflow.errors import ConfigError
    from opdflow.record.rundir import default_path

    try:
        cfg = load_pipeline(pipeline, list(overrides))
        if storage:  # tiny models built where every node reads them (unless the cluster says)
            os.environ.setdefault("OPDFLOW_CACHE", str(Path(storage) / "cache"))
        where = Path(resume or run_dir or default_path(cfg)).absolute()
        print(RUN_DIR_MARK + str(where), flush=True)
        if resume:
            summary = run_with_progress(cfg, None, str(where))
        else:
            summary = run_with_progress(cfg, str(where))
    except ConfigError as exc:
        print(ERROR_MARK + " ".join(str(exc).split()), flush=True)
        sys.exit(2)
    print(SUMMARY_MARK + json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    job_entry()
