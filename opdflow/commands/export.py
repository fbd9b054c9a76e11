"""`opdflow export`: a run's distilled student as a Hugging Face checkpoint."""

from __future__ import annotations

import click


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--step", type=int, default=None, help="Export the checkpoint of this step (default: latest)."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="New directory for the checkpoint (config, tokenizer, bf16 safetensors).",
)
@click.option(
    "--max-shard-size",
    default="5GB",
    show_default=True,
    help="Largest safetensors file; bigger models are sharded with an index, like save_pretrained.",
)
def export(run_dir: str, step: int | None, out: str, max_shard_size: str) -> None:
    """Write RUN_DIR's student (its latest checkpoint, or --step N) to --out as a Hugging Face
    checkpoint that AutoModelForCausalLM.from_pretrained and vLLM load."""
    from opdflow.record.export import export_run, parse_size

    path = export_run(run_dir, out, step, parse_size(max_shard_size))
    click.echo(str(path))
