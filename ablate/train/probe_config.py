"""The gradient-fidelity probes' settings (``ProbeConfig``): what ``ablate.train.probe`` measures
during a run, checked where a study is validated. Not part of a run's key nor of its params."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from backends.recipes import GEMMS, Gemm

ProbeGemm = Gemm


@dataclass(kw_only=True, slots=True)
class ProbeConfig:
    """Gradient-fidelity probes during training (``ablate.train.probe``, numerics in
    ``backends.layer.probe``): at every ``every``-th step, on fixed probe batches, each quantized GEMM of
    the chosen layers is compared with the exact GEMM on the same operands. Probes change nothing
    the run computes: a run is bit-identical with them on or off, and they are not in its key."""

    every: int = 10
    """Probe at step 0 and every N optimizer steps."""
    batches: int = 1
    """Probe batches: the first N full validation batches (train.batch_size x train.seq_len each,
    split into train.grad_accum micro-batches as a training step is)."""
    gemms: list[ProbeGemm] = field(default_factory=lambda: ["wgrad"])
    """GEMMs to probe, any of fprop, dgrad, wgrad (those a layer runs in high precision are
    skipped). Default wgrad, the GEMM of the structured-error diagnosis; each GEMM adds about a
    training step's worth of work to a probe step on the CPU (see the README's measured cost)."""
    layers: list[int] | Literal["all"] = "all"
    """Transformer blocks to probe: all, or a list of block indices."""
    repeats: int = 2
    """Draws of the randomness of a random GEMM (SR, random Hadamard) for its bias and variance;
    each draw beyond the first costs about one quantized GEMM per probed GEMM."""
    window: int = 4
    """K: probes summed for the error-structure ratio |sum of K errors| / (K x mean error)."""

    def __post_init__(self) -> None:
        for name in ("every", "batches", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe.{name}: must be >= 1, got {getattr(self, name)}")
        if self.window < 2:
            raise ValueError(f"probe.window: must be >= 2, got {self.window}")
        allowed = GEMMS
        if not self.gemms:
            raise ValueError(f"probe.gemms: empty; allowed: {', '.join(allowed)}")
        for i, g in enumerate(self.gemms):
            if g not in allowed:
                raise ValueError(f"probe.gemms[{i}]: unknown {g!r}; allowed: {', '.join(allowed)}")
        if len(set(self.gemms)) != len(self.gemms):
            raise ValueError(f"probe.gemms: a GEMM is listed twice in {self.gemms}")
        if isinstance(self.layers, str):
            if self.layers != "all":
                raise ValueError(
                    f"probe.layers: unknown {self.layers!r}; allowed: all or a list of block indices"
                )
        else:
            if not self.layers:
                raise ValueError("probe.layers: empty; give all or a list of block indices")
            for i, b in enumerate(self.layers):
                if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                    raise ValueError(
                        f"probe.layers[{i}]: {b!r} is not a block index (an integer >= 0)"
                    )
            if len(set(self.layers)) != len(self.layers):
                raise ValueError(f"probe.layers: a block is listed twice in {self.layers}")

    def problems(
        self, *, n_layers: int | None, seq_len: int, batch_size: int, val_tokens: int
    ) -> list[str]:
        """What stops these probes on a run's model (``n_layers`` blocks) and data (each line
        names its path); ``ablate.train.config.probe_problems`` reads them from a ``RunConfig``."""
        out: list[str] = []
        if self.layers != "all" and n_layers is not None:
            for i, b in enumerate(self.layers):
                if b >= n_layers:
                    out.append(
                        f"probe.layers[{i}]: block {b} does not exist; the model has "
                        f"{n_layers} blocks (0-{n_layers - 1})"
                    )
        full = ((val_tokens - 1) // seq_len) // batch_size
        if self.batches > full:
            need = self.batches * batch_size * seq_len + 1
            out.append(
                f"probe.batches: {self.batches} probe batches of train.batch_size x train.seq_len "
                f"= {batch_size} x {seq_len} tokens need data.val_tokens >= {need} (it is "
                f"{val_tokens}: {full} full batches); lower probe.batches or raise "
                "data.val_tokens"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "batches": self.batches,
            "gemms": list(self.gemms),
            "layers": self.layers if isinstance(self.layers, str) else list(self.layers),
            "repeats": self.repeats,
            "window": self.window,
        }
