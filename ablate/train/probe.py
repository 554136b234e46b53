"""Gradient-fidelity probes in the trainer: ``Prober`` runs ``backends.layer.probe`` on a model at probe
steps and names the metrics; ``probe_checkpoints`` runs the same probes on saved checkpoints.

At a probe step (step 0 and every ``ProbeConfig.every`` steps) the prober runs a forward and
backward pass over the fixed probe batches (the first ``batches`` full validation batches, split
into ``train.grad_accum`` micro-batches as a training step is, under the training autocast),
capturing every GEMM call of the probed ``QuantLinear`` layers; then, for each layer and each
quantized GEMM in ``ProbeConfig.gemms``, ``backends.layer.probe.probe_gemm`` compares the quantized GEMM
with the exact one on the captured operands, and ``ErrorHistory`` follows its error from probe to
probe. The pass changes nothing the run computes: gradients come from ``torch.autograd.grad`` (the
parameters' ``.grad`` is untouched), the layers' call counters are restored, the global RNG is forked,
the batch sampler is not used, and redraws use streams training never uses. A run is bit-identical
with probes on or off (tested).

Metrics (``backends.layer.probe`` defines each), logged with the step's other metrics:

    probe.<gemm>.<metric>              mean over the probed layers
    probe.<gemm>.<metric>.L<i>         mean over the probed linears of transformer block i
    probe.<gemm>.<operand>.<metric>    per operand (x, w, dy): sat, ftz, util; also per block
    probe.seconds                      wall time of the probe step
    probe.cost                         probe.seconds / the mean training step so far (step > 0)

The error-structure history (``step_cos``, ``sum_ratio``) lives in memory: a resumed run starts it
again, so those two metrics reappear one and ``window`` probes after a resume.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ablate.data import val_batches
from ablate.train.config import ProbeConfig, RunConfig, config_hash, probe_problems
from backends.layer import QuantLinear
from backends.layer.probe import ErrorHistory, GemmCall, capture, draws_for, probe_gemm

Batch = tuple[torch.Tensor, torch.Tensor]
_BLOCK = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")  # the block index rule of backends.convert_model


def block_of(name: str) -> int | None:
    """The transformer block of a linear from its path (``layers.3.attention.wq`` -> 3)."""
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def probe_batches(
    val: torch.Tensor, cfg: ProbeConfig, seq_len: int, batch_size: int
) -> list[Batch]:
    """The fixed probe batches: the first ``cfg.batches`` full validation batches."""
    full = [b for b in val_batches(val, seq_len, batch_size) if b[0].shape[0] == batch_size]
    if len(full) < cfg.batches:
        raise ValueError(
            f"probe.batches: {cfg.batches} probe batches of {batch_size} x {seq_len} tokens, but "
            f"the validation set holds {len(full)} full batches; lower probe.batches or raise "
            "data.val_tokens"
        )
    return full[: cfg.batches]


class Prober:
    """The probes of one run (see the module docstring)."""

    def __init__(
        self,
        cfg: ProbeConfig,
        model: nn.Module,
        batches: Sequence[Batch],
        *,
        grad_accum: int = 1,
        ctx: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.batches = list(batches)
        self.grad_accum = grad_accum
        self.ctx = ctx
        self.history = ErrorHistory(cfg.window)
        self.all_layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        wanted = None if cfg.layers == "all" else set(cfg.layers)
        self.layers: dict[str, QuantLinear] = {}
        self.gemms: dict[str, list[str]] = {}
        for name, layer in self.all_layers.items():
            block = block_of(name)
            if wanted is not None and block not in wanted:
                continue
            gemms: list[str] = [g for g in cfg.gemms if not layer.recipe.gemm(g).high_precision]
            if gemms:
                self.layers[name], self.gemms[name] = layer, gemms

    @property
    def active(self) -> bool:
        """Whether any layer has a quantized GEMM to probe (a high-precision run has none)."""
        return bool(self.layers)

    def due(self, step: int) -> bool:
        return self.active and step % self.cfg.every == 0

    def capture(self) -> dict[str, list[GemmCall]]:
        """The probe pass: forward and backward over the probe batches, every GEMM call of the
        probed layers recorded; nothing of the model's state changes."""
        model = self.model
        counters = {n: m.calls.clone() for n, m in self.all_layers.items()}
        params = [p for p in model.parameters() if p.requires_grad]
        device = next(model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        was_training = model.training
        model.train()  # the layers see what a training step does (the counters are restored)
        try:
            with torch.random.fork_rng(devices=devices), capture(self.layers) as calls:
                for x, y in self.batches:
                    x, y = x.to(device), y.to(device)
                    for xm, ym in zip(
                        x.chunk(self.grad_accum), y.chunk(self.grad_accum), strict=True
                    ):
                        with self.ctx() if self.ctx is not None else nullcontext():
                            loss = model(xm, ym)
                        torch.autograd.grad(loss / self.grad_accum, params, allow_unused=True)
        finally:
            with torch.no_grad():
                for n, m in self.all_layers.items():
                    m.calls.copy_(counters[n])
            model.train(was_training)
        return calls

    def run(self, step_seconds: float | None = None) -> dict[str, float]:
        """Probe now: the metrics of the module docstring (empty when nothing is probed).
        ``step_seconds``: the mean training step, for ``probe.cost``."""
        if not self.active:
            return {}
        t0 = time.perf_counter()
        calls = self.capture()
        per_layer: dict[str, dict[str, float]] = {}  # "<gemm>.<metric>" per layer
        with torch.no_grad():
            for name, layer in self.layers.items():
                m: dict[str, float] = {}
                for gemm in self.gemms[name]:
                    mine = [c for c in calls[name] if c.gemm == gemm]
                    if not mine:  # e.g. dgrad of a layer whose input needs no gradient
                        continue
                    draws = draws_for(layer.recipe.gemm(gemm), self.cfg.repeats)
                    p = probe_gemm(layer, mine, draws)
                    p.metrics.update(self.history.update(f"{name}.{gemm}", p.error, p.exact))
                    m.update({f"{gemm}.{k}": v for k, v in p.metrics.items()})
                per_layer[name] = m
        out = aggregate(per_layer)
        seconds = time.perf_counter() - t0
        out["probe.seconds"] = seconds
        if step_seconds:
            out["probe.cost"] = seconds / step_seconds
        return out


def make_prober(
    config: RunConfig,
    model: nn.Module,
    val: torch.Tensor,
    ctx: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Prober | None:
    """The prober of a run (None when ``config.probe`` is off); ValueError naming the ``probe.``
    path when its layers or batches do not fit the run's model and data."""
    cfg = config.probe
    if cfg is None:
        return None
    problems = probe_problems(cfg, config)
    if problems:
        raise ValueError("; ".join(problems))
    tc = config.train
    batches = probe_batches(val, cfg, tc.seq_len, tc.batch_size)
    return Prober(cfg, model, batches, grad_accum=tc.grad_accum, ctx=ctx)


def aggregate(per_layer: dict[str, dict[str, float]]) -> dict[str, float]:
    """``probe.<metric>`` (mean over layers) and ``probe.<metric>.L<block>`` (mean over a block's
    layers) from each layer's ``<gemm>.<metric>`` values."""
    overall: dict[str, list[float]] = defaultdict(list)
    by_block: dict[str, list[float]] = defaultdict(list)
    for name, metrics in per_layer.items():
        block = block_of(name)
        for k, v in metrics.items():
            overall[f"probe.{k}"].append(v)
            if block is not None:
                by_block[f"probe.{k}.L{block}"].append(v)
    return {k: _mean(v) for k, v in (overall | by_block).items()}


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def probe_checkpoints(
    config: RunConfig,
    checkpoints: Sequence[str | Path],
    cfg: ProbeConfig | None = None,
    *,
    device: str | None = None,
) -> list[tuple[int, dict[str, float]]]:
    """The probes of ``cfg`` (default: ``config.probe`` or ``ProbeConfig()``) run post hoc on saved
    checkpoints of ``config``'s run, in step order (the error-structure history runs across them):
    ``[(step, metrics)]``. A checkpoint (a ``checkpoint.pt`` or the folder holding one) that another
    configuration wrote is refused with a ValueError. ``device`` overrides where it runs (default:
    ``config.device``); the run's numbers are those of its device kind."""
    from ablate.data import load_data
    from ablate.model import build_model
    from ablate.train.checkpoint import CHECKPOINT, load_file
    from ablate.train.device import autocast, resolve_device

    cfg = cfg or config.probe or ProbeConfig()
    problems = probe_problems(cfg, config)
    if problems:
        raise ValueError("; ".join(problems))
    dev = resolve_device(device or config.device)
    data = load_data(config.data, cache=config.data_cache)
    model = build_model(
        config.model,
        data.vocab_size,
        recipe=config.recipe,
        backend=config.backend,
        seed=config.seed,
        device=dev,
    )
    want = config_hash(config)
    loaded = []
    for c in checkpoints:
        path = Path(c)
        path = path / CHECKPOINT if path.is_dir() else path
        if not path.exists():
            raise ValueError(f"--checkpoint: {path} does not exist")
        ck = load_file(path, keys=("config_hash", "state", "model"))
        if ck.get("config_hash") != want:
            raise ValueError(
                f"--checkpoint: {path} was written by another configuration "
                f"({ck.get('config_hash')} != {want})"
            )
        loaded.append((int(ck["state"]["step"]), str(path), ck["model"]))
    loaded.sort(key=lambda t: t[0])
    tc = config.train
    prober = Prober(
        cfg,
        model,
        probe_batches(data.val, cfg, tc.seq_len, tc.batch_size),
        grad_accum=tc.grad_accum,
        ctx=lambda: autocast(tc.precision, dev),
    )
    out = []
    for step, _, state in loaded:
        model.load_state_dict(state)
        out.append((step, prober.run()))
    return out
