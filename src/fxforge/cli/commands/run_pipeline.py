"""``fxforge run-pipeline``: run a split model's stages as processes on torch.distributed, verify and time them."""

from __future__ import annotations

import click

from fxforge.cli.options import emit_json, json_option, status, stdout, trust_pickle_option
from fxforge.errors import EXIT_FINDINGS


@click.command(
    "run-pipeline",
    epilog="""\b
Examples:
  fxforge run-pipeline out/resnet18-4
  fxforge run-pipeline out/resnet18-4 --microbatches 8 --schedule 1f1b --repeats 10 --json
Across machines: torchrun ... -m fxforge.distributed DIR (docs/commands/run-pipeline.md).
Exit code: 1 when a stage fails, dies or times out (every process is stopped; the message names the stage and
its first error line), or the pipeline's output differs from the unsplit model; 2 for bad input (a stage file
that is corrupt or does not match plan.json included).
""",
)
@click.argument("directory", type=click.Path(path_type=str))
@click.option(
    "--input",
    "-i",
    "inputs",
    multiple=True,
    metavar="SPEC",
    help="Whole-batch input shape (default: the split's example shape, times --microbatches along the batch).",
)
@click.option("--microbatches", "-m", type=click.IntRange(min=1), default=None, help="Default: stages, at least 4.")
@click.option(
    "--schedule",
    "schedules",
    type=click.Choice(["gpipe", "1f1b"]),
    multiple=True,
    help="Pipeline schedule (repeat for several; default: both, 1f1b when microbatches >= stages).",
)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs per schedule.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Untimed runs first.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Threads per stage process.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds the whole run may take before the hung stage is named and every process stopped.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: one GPU per stage with NCCL where there are enough GPUs, else the CPU with gloo.",
)
@click.option("--no-verify", is_flag=True, help="Do not compare the output with the unsplit model.")
@click.option("--no-baseline", is_flag=True, help="Do not time the unsplit model in one process.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1), help="Seed for the inputs.")
@trust_pickle_option
@json_option
def command(
    directory: str,
    inputs: tuple[str, ...],
    microbatches: int | None,
    schedules: tuple[str, ...],
    repeats: int,
    warmup: int,
    threads: int,
    timeout: float,
    device: str,
    no_verify: bool,
    no_baseline: bool,
    seed: int,
    trust_pickle: bool,
    as_json: bool,
) -> None:
    """Run the stages of DIRECTORY (fxforge split -o) as a pipeline: one process per stage, verified and timed."""
    from fxforge.cli.render import render_pipeline_run
    from fxforge.distributed import run_pipeline

    with status("running the pipeline", as_json):
        result = run_pipeline(
            directory,
            inputs=list(inputs),
            microbatches=microbatches,
            schedules=list(schedules) or None,
            repeats=repeats,
            warmup=warmup,
            timeout=timeout,
            threads=threads,
            device=device,
            verify=not no_verify,
            baseline=not no_baseline,
            seed=seed,
            trust_pickle=trust_pickle or None,
        )
    if as_json:
        emit_json(result.to_dict())
    else:
        render_pipeline_run(stdout, result)
    if not result.ok:
        raise SystemExit(EXIT_FINDINGS)
