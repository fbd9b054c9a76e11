"""bench/gpu_check.py runs its whole GPU code path small on a CPU, with Ray and vLLM not
importable (as on a GPU machine that has only torch and transformers): every stage runs
through the pipeline's own plain classes, each beside its memory plan, and the micro-batched
gradient equals the full-batch one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NO_RAY = (
    "import runpy, sys; sys.modules.update(ray=None, vllm=None); "  # import ray -> ImportError
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.slow  # every stage in a child process: the stages' own tests are in the fast tier
def test_gpu_check_runs_tiny_on_cpu_without_ray(tmp_path):
    out = tmp_path / "check.json"
    args = [str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "micro-batched gradient == full-batch gradient on 4 responses: yes" in done.stdout
    result = json.loads(out.read_text())
    assert [s["stage"] for s in result["stages"]] == ["sampling", "rescore", "teacher", "learner"]
    assert all(s["tokens_per_s"] > 0 and s["peak_mem_gb"] > 0 for s in result["stages"])
    assert all(s["plan_gb"] > 0 for s in result["stages"])  # the memory plan beside each
    assert "peak/plan" in done.stdout
    assert result["learner"]["micro_batches"] > 1 and result["gradient"]["equal"]
