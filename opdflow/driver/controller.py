"""The controller: wires ObjectRefs between stage actors and enforces the staleness bound.

```
 prompts ──▶ GeneratorPool ──▶ Rescorer ──▶ TeacherScorer ──▶ Learner ──┐
             N engines at v     BF16 at v    logp_teacher      step n    │ version n+1
             (recipe c)         logp_rescore                   AdamW     │ publish
     ▲                                                                   │
     └──────────── WeightStore (versioned refs) ◀──────────────────────────┘
  bound: step n trains on a batch from version v only if n - v <= k (k = 0: synchronous)
```

Generation for step s is launched as soon as version s - k exists, with the freshest
version; batches flow stage to stage as ObjectRefs without touching the driver. The
driver waits only for the batch of the step it trains next: that wait is trainer wait.
A batch whose version broke the bound (k lowered after launch) is dropped and
regenerated, and counted. That rule is core/launch.py's `Launches`, which the simulator
drives too. Dead stage actors are restarted by Ray and their work re-run,
each restart recorded (restarts.py); a stuck one is killed after a deadline
(supervisor.py). A lost learner rank is healed in-run: a new group from the last
checkpoint, the loop rewound to it (healing.py). Checkpoints every N steps (written in the
background, committed once complete) and on SIGINT/SIGTERM make a run resumable; a
finished run leaves its student in final/ (export.py). The loop below reads as
the dataflow; its parts live with the state they own: the batches in flight in `Rollouts`
(rollouts.py), the rows, clock and restarts in `StepRecorder` (recorder.py), the learner
group and its checkpoints in `Healer` (healing.py), the actors in `Stages` (assembly.py),
the run's placement, trackers and checkpoint files in `RunWiring` (wiring.py); connecting
to Ray and creating, resuming or cleaning up the run directory is the session's.
"""

from __future__ import annotations

from collections.abc import Callable

from ray.exceptions import RayError

from opdflow.analysis.summary import summarize
from opdflow.cluster.supervisor import LearnerLost, StageFailed, StopRequested, stop_on_signals
from opdflow.config import PipelineConfig
from opdflow.driver.assembly import Stages
from opdflow.driver.healing import Healer
from opdflow.driver.recorder import StepRecorder
from opdflow.driver.rollouts import Rollouts
from opdflow.driver.wiring import RunInputs, RunWiring
from opdflow.record.checkpoint import Checkpoint
from opdflow.record.rundir import RunDir


def run_pipeline(
    cfg: PipelineConfig, run: RunDir, on_step: Callable[[dict], None] = lambda r: None,
    resume: Checkpoint | None = None, on_start: Callable[[Stages], None] = lambda st: None,
    inputs: RunInputs | None = None,
) -> dict:  # fmt: skip
    """Train cfg.train.steps learner steps (from `resume` if given) in a connected Ray (a
    Session's); returns the run summary. `inputs`: what the session read (else read here)."""
    inputs = inputs or RunInputs.for_run(cfg, run, resume)
    with (
        RunWiring.open(cfg, run, inputs) as wiring,  # trackers (params logged once), placement
        Stages.start(cfg, inputs, wiring.placement) as st,  # every actor; killed at the end
    ):
        wiring.check_checkpoint_root(st.learner)
        on_start(st)
        first, steps = st.restore(resume, run), cfg.train.steps
        flight = Rollouts.start(cfg, run, st, wiring, first, resume)  # nothing in flight yet
        gate = flight.gate  # the launch rule: steps launched, batches dropped
        st.begin(run, first)
        flight.launch_ready()  # within the staleness bound
        rec = StepRecorder(cfg, run, st, wiring, first, on_step)  # the run clock starts
        healer = Healer(cfg, run, st, wiring, rec.clock, first)  # a lost learner rank: rewind
        with stop_on_signals() as stop:
            step = first
            while step < steps:
                try:
                    job = flight.next_batch(step, healer.watches)  # trainer wait
                    out = healer.train(step, job.ref, job.links)
                    st.store.publish(out.pop("weights"))
                    timing = rec.clock.tick(step + 1)
                    flight.observe(step, job, timing[0], out)  # k, the generator pool
                    _check_finite(cfg, out)
                    flight.launch_ready()
                    flight.release_weights()
                    rec.evaluate(step + 1)
                    rec.record(step, job, out, timing, flight)
                    if stop.requested or _checkpoint_due(step + 1, cfg):
                        rec.flush()  # the rows that wait for an evaluation, before the save
                        healer.checkpoint(step + 1, flight.state(), wait=stop.requested)
                        _stop_if(stop.requested, run, step)
                    healer.commit()  # a checkpoint once complete
                    step += 1
                except (LearnerLost, RayError) as exc:  # anything else is not healed
                    step = healer.heal(exc, step, flight.pending, gate, rec.rows)
        rec.finish()
        healer.checkpoint(steps, flight.state(), wait=True)
        wiring.export_final(steps)
        summary = summarize(run, healer.get(st.learner.record.remote()), gate.dropped, first)
        run.write_json("summary.json", summary)
        return summary


def _checkpoint_due(done: int, cfg: PipelineConfig) -> bool:
    every = cfg.reliability.checkpoint_every
    return bool(every) and done % every == 0 and done < cfg.train.steps


def _check_finite(cfg: PipelineConfig, out: dict) -> None:
    """Stop the run once more steps than train.max_bad_steps had a non-finite loss."""
    if out["bad_steps"] > cfg.train.max_bad_steps:
        raise StageFailed("learner", f"{out['bad_steps']} steps had a non-finite loss "
                          f"(train.max_bad_steps={cfg.train.max_bad_steps})",
                          "lower train.lr or check the models")  # fmt: skip


def _stop_if(requested: bool, run: RunDir, step: int) -> None:
    """On SIGINT/SIGTERM, once the checkpoint after `step` is committed: stop the run."""
    if requested:
        raise StopRequested(f"stopped after step {step} (checkpoint written); resume with "
                            f"--resume {run.path}")  # fmt: skip
