"""What a run's device-dependent settings mean on a device kind (cpu or cuda): ``auto`` and the
other choices that resolve per device (``train.precision``, ``train.compile``,
``train.log_every``, ``quantizer_graph``), read the same way by the key, the trainer and the plan.
"""

from __future__ import annotations

import re
from typing import Literal

Compile = Literal["auto"] | bool


DEVICES = "auto, cpu, cuda, cuda:N"


def check_device_name(device: object) -> None:
    """Refuse a ``device`` that names no device a run trains on (torch also knows ``meta``,
    ``mps``, ``xpu``... which its key would record as cpu), naming the field."""
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", device):
        raise ValueError(f"device: unknown {device!r}; allowed: {DEVICES}")


def device_kind(device: str) -> Literal["cpu", "cuda"]:
    """The kind of device a run of ``RunConfig.device`` trains on: ``cuda`` for cuda and cuda:N;
    ``auto`` is cuda when this process sees one (a study resolves ``auto`` when it expands, from
    ``resources.gpus``, so that its keys do not depend on where a command runs)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.split(":", 1)[0] == "cuda" else "cpu"


def resolved_precision(precision: str, kind: str) -> Literal["bf16", "fp32"]:
    """What ``train.precision`` means on a device kind: ``auto`` is bf16 autocast on CUDA and fp32
    on the CPU (every GPU this project targets, sm_80+ and CDNA, computes in bf16)."""
    if precision == "auto":
        return "bf16" if kind == "cuda" else "fp32"
    return "bf16" if precision == "bf16" else "fp32"


def resolved_log_every(log_every: int | None, kind: str) -> int:
    """What ``train.log_every`` means on a device kind (None: 1 on the CPU, 10 on CUDA)."""
    return log_every if log_every is not None else (10 if kind == "cuda" else 1)


def resolved_compile(compile: Compile, kind: str) -> bool:
    """What ``train.compile`` (or ``train.fused_adamw``) means on a device kind: ``auto`` is on
    for CUDA, off on the CPU."""
    return kind == "cuda" if compile == "auto" else bool(compile)


def resolved_quantizer_graph(graph: str, compile: Compile, kind: str) -> str:
    """What ``quantizer_graph`` means for a run on a device kind: ``inline`` or ``opaque`` for a
    compiled run (auto: inline on CUDA), ``opaque`` (nothing traced) for an eager one."""
    if not resolved_compile(compile, kind):
        return "opaque"
    if graph == "auto":
        return "inline" if kind == "cuda" else "opaque"
    return graph
