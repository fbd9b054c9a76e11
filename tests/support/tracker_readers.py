"""Read back what each tracker wrote locally: W&B offline run files, MLflow, TensorBoard.

W&B's Python package no longer ships a reader for its .wandb transaction log (wandb-core,
in Go, reads it), so `wandb_records` parses the documented LevelDB-log framing (":W&B"
header, 32 KiB blocks, 7-byte record headers) and decodes each record with wandb's own
protobuf `Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B run log"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (_FULL, _FIRST) else buf + chunk
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def wandb_offline_run(run_dir: Path) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """(history by step, config) of the one offline W&B run under run_dir/wandb."""
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history: dict[int, dict[str, float]] = {}
    config: dict[str, Any] = {}
    for rec in wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            step = int(items.pop("_step"))
            history[step] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    return history, config


def mlflow_run(
    tracking_uri: str, experiment: str
) -> tuple[dict[int, dict[str, float]], dict[str, str]]:
    """(metrics by step, params) of the one run in an MLflow experiment, through MlflowClient."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, runs
    run = runs[0]
    history: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            history.setdefault(m.step, {})[key] = m.value
    return history, run.data.params


def tensorboard_run(logdir: Path) -> tuple[dict[int, dict[str, float]], str]:
    """(scalars by step, the params text) from TensorBoard event files, via EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    history: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            history.setdefault(ev.step, {})[tag] = ev.value
    text = ""
    if "params/text_summary" in acc.Tags()["tensors"]:
        text = acc.Tensors("params/text_summary")[0].tensor_proto.string_val[0].decode()
    return history, text
