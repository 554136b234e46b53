"""What a study's cells to run cost in compute: FLOPs of the steps they will train (decay branches
counted from their branch points) and the GPU-hours that takes at a sustained throughput.

Per token, the training FLOPs of the model (``ablate.model.flops_per_token``: 6 N + 12 L C T, the
block linears and the LM head, forward and backward; a Hugging Face architecture 6 times its
parameters), times the tokens of every step a cell trains. Evaluations (a forward only, a few
percent of a study) and the emulation of FP4/FP8 in software (slower than native GEMMs) are not
counted: the figure is what a native run costs at the throughput given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ablate.driver import branching
from ablate.driver.planning import TO_RUN, PlannedCell
from ablate.model import flops_per_token, num_params
from ablate.study import Study

SUSTAINED_TFLOPS = 400.0
"""The default sustained throughput per GPU: an H100's 989 dense BF16 TFLOP/s at 40% utilization."""


@dataclass(frozen=True)
class Compute:
    """The cells to run: steps they train, tokens and FLOPs, and the GPUs a cell spans."""

    steps: int
    tokens: float
    flops: float

    def gpu_hours(self, tflops: float = SUSTAINED_TFLOPS) -> float:
        """GPU-hours at ``tflops`` sustained per GPU (TFLOP/s)."""
        return self.flops / (tflops * 1e12) / 3600


def flops_per_token_of(cell: object) -> float:
    """A cell's training FLOPs per token (module docstring)."""
    config = cell.config  # type: ignore[attr-defined]
    model = config.model
    if model.hf is not None:
        return 6.0 * num_params(model)
    return flops_per_token(model, config.train.seq_len)


def compute(study: Study, planned: Iterable[PlannedCell]) -> Compute:
    """What the cells to run of ``planned`` train (``ablate plan``)."""
    planned = list(planned)
    by_key = {p.cell.key: p for p in planned}
    members = branching.members(study)
    per_token: dict[str, float] = {}
    steps = 0
    tokens = flops = 0.0
    for p in planned:
        if p.action not in TO_RUN:
            continue
        t = p.cell.config.train
        n = t.steps - branching.start_step(study, p, by_key, members.get(p.cell.key))
        shape = repr((p.cell.config.model.to_dict(), t.seq_len))
        if shape not in per_token:
            per_token[shape] = flops_per_token_of(p.cell)
        steps += n
        tokens += n * t.tokens_per_step
        flops += n * t.tokens_per_step * per_token[shape]
    return Compute(steps, tokens, flops)
