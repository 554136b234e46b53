"""Named precision schedules: the submitted 2026 runs' recipes with their phases, by name, each
citing its source (``NAMED_SCHEDULES``). A cell says ``schedule: NAME`` (in ``base`` or as an
axis) and gets the schedule's recipe, base format, warmup and tail, except what it sets itself:
a section key by key, so that ``warmup.first`` varies a schedule's warmup. Where a value belongs to
the run more than to the recipe (a tail's length, tied to the learning-rate decay), the schedule
names it in ``open`` and its description says so: the source's value stands in, an argument the
study overrides by that key. ``ablate recipe NAME`` prints one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ablate.study.messages import did_you_mean


@dataclass(frozen=True)
class NamedSchedule:
    """A published precision schedule: the cell keys it sets and where they come from."""

    name: str
    description: str
    source: str
    keys: Mapping[str, Any]
    """The cell keys it sets: ``recipe``, ``base_format``, ``warmup``, ``tail``."""
    open: tuple[str, ...] = field(default=())
    """Its keys that belong to the run (dotted: ``tail.last``): the source's value, an argument."""


_SCHEDULES = (
    NamedSchedule(
        "amd_mlperf_mxfp4",
        "AMD's MLPerf Training Llama 3.1-8B submission on MI355X: MXFP4 with the deterministic "
        "16-point Hadamard transform on every GEMM of the linear layers (amd_mxfp4_h16) from the "
        "first trained step. Its configuration's FP8 'warmup' (SYNTH_WARMUP_STEPS=20, "
        "WARMUP_RECIPE=fp8_hybrid) is not a phase of training: 20 steps on synthetic tokens that "
        "compile the kernels, after which Primus restores the weights, the optimizer and the "
        "learning-rate schedule and resets the scaling state (WARMUP_RECIPE only picks the "
        "autocast around those steps). So this schedule has one phase; its warmup section (FP8, "
        "length 0) is there to be varied: warmup.first asks how long an FP8 warmup MXFP4 needs.",
        "AMD-AGI/Primus at fd1eeab: examples/mlperf/llama3.1_8b/config_MI355X_1x8x1.sh "
        "(FP4_RECIPE=mxfp4, NVTE_MXFP4_USE_HADAMARD=1, SYNTH_WARMUP_STEPS=20, "
        "WARMUP_RECIPE=fp8_hybrid; the same file as the MLPerf Training v6.0 submission's "
        "AMD/benchmarks/llama31_8b/implementations/MI355X_EPYC_9575F_primus), "
        "configs/MI355X/llama3.1_8B-pretrain-FP4.yaml (fp4: e2m1, fp4_recipe: mxfp4); "
        "AMD-AGI/mlperf-common at 56d8ca7, primus_mllog/warmup.py (the synthetic warmup: "
        "optimizer neutered, parameters restored from a snapshot, Adam state zeroed, the "
        "learning-rate schedule rolled back)",
        {"recipe": "amd_mxfp4_h16", "warmup": {"recipe": "fp8", "first": 0}},
    ),
    NamedSchedule(
        "nvidia_nvfp4_bf16_tail",
        "NVIDIA's NVFP4 pretraining recipe (nvidia_nvfp4) with its forward GEMM switched to BF16 "
        "for the last 18% of training: the 12B model switched at 8.2T of its 10T tokens, which "
        "took its relative loss gap to FP8 from about 1.5% to 0.5%; switching the backward GEMMs "
        "as well added nothing there, and the forward alone is about a third of the tail's "
        "compute (about 6% of the run's). That run decayed its learning rate over the last 20% "
        "(warmup-stable-decay); the paper advises switching shortly before the decay starts: "
        "where a study's decay is not the last 20%, set tail.last to about its share.",
        "Pretraining Large Language Models with NVFP4 (NVIDIA, arXiv 2509.25149), Appendix D, "
        "Switching to Higher Precision, and its figure of the 12B model's relative loss",
        {
            "recipe": "nvidia_nvfp4",
            "tail": {"recipe": "bf16", "gemms": ["fprop"], "last": 0.18},
        },
        open=("tail.last",),
    ),
)
NAMED_SCHEDULES: dict[str, NamedSchedule] = {s.name: s for s in _SCHEDULES}


def schedule_keys(data: Any) -> Any:
    """A cell's ``schedule: NAME`` applied to its raw keys (a ``CellConfig`` validator that runs
    before the fields'): the schedule's keys where the cell does not set them, a section's key by
    key; ValueError for an unknown name, naming the allowed ones."""
    if not isinstance(data, dict) or data.get("schedule") is None:
        return data
    name = data["schedule"]
    if not isinstance(name, str) or name not in NAMED_SCHEDULES:
        allowed = list(NAMED_SCHEDULES)
        hint = did_you_mean(name, allowed) if isinstance(name, str) else ""
        raise ValueError(f"schedule: unknown {name!r}{hint}; allowed: {', '.join(allowed)}")
    out = dict(data)
    for key, value in NAMED_SCHEDULES[name].keys.items():
        given = out.get(key)
        if isinstance(value, dict):
            out[key] = {**value, **(given if isinstance(given, dict) else {})}
        elif given is None:
            out[key] = value
    return out
