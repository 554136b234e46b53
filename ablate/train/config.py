"""Typed run configuration: what one cell of a study trains (``RunConfig``).

``RunConfig`` = model + data + training loop + recipe + backend + seed. Every field is documented
and declares how it enters a cell's key (``ablate.key``: ``config_hash`` builds the key from those
declarations); ``__post_init__`` validation raises ``ValueError`` naming the field (as its dotted
path in a study, e.g. ``train.grad_accum``) and what would be right. ``to_dict``/``from_dict`` give
the plain nested form that the study resolves into and MLflow records as params (``flatten``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ablate.data import SEED_LIMIT, DataConfig
from ablate.key import always, digest, key_fields, never, unless_default
from ablate.model import PRESETS, ModelConfig
from ablate.model.hf_config import check_config, check_weights
from ablate.numerics import FIRST_KEYED, NUMERICS_VERSION
from ablate.train.phases import Phase, check, normalized
from ablate.train.probe_config import ProbeConfig as ProbeConfig
from ablate.train.resolve import Compile as Compile
from ablate.train.resolve import check_device_name
from ablate.train.resolve import device_kind as device_kind
from ablate.train.resolve import resolved_compile as resolved_compile
from ablate.train.resolve import resolved_log_every as resolved_log_every
from ablate.train.resolve import resolved_precision as resolved_precision
from ablate.train.resolve import resolved_quantizer_graph as resolved_quantizer_graph
from backends.recipes import Recipe

Precision = Literal["auto", "bf16", "fp32"]
Parallel = Literal["auto", "none", "ddp", "fsdp"]
Checkpointing = Literal["none", "blocks"]
QuantizerGraph = Literal["auto", "opaque", "inline"]
Schedule = Literal["cosine", "wsd"]
AllGather = Literal["fp32", "bf16"]
RankDraws = Literal["per_rank", "shared"]


# How the fields below enter a cell's key (``ablate.key``): the value the key holds on a device kind
def _precision(v: Any, train: TrainConfig, kind: str) -> str:
    return resolved_precision(v, kind)


def _on(v: Any, train: TrainConfig, kind: str) -> bool:
    return resolved_compile(v, kind)


def _quantizer_graph(v: Any, run: RunConfig, kind: str) -> str:
    if run.recipe.high_precision:  # no quantizer in the graph
        return "opaque"
    return resolved_quantizer_graph(v, run.train.compile, kind)


def _parallel(v: Any, train: TrainConfig, kind: str) -> str:
    return train.resolved_parallel


def _whole_schedule(train: TrainConfig, kind: str) -> bool:
    return train.schedule_end == train.steps  # the whole run on its schedule


def _not_wsd(train: TrainConfig, kind: str) -> bool:
    return train.schedule != "wsd"


def _one_process(train: TrainConfig, kind: str) -> bool:
    return train.resolved_parallel == "none"


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The optimization loop."""

    steps: int = field(default=200, metadata=always())
    """Optimizer steps."""
    batch_size: int = field(default=16, metadata=always())
    """Sequences per optimizer step (tokens per step = batch_size * seq_len)."""
    grad_accum: int = field(default=1, metadata=always())
    """Micro-batches per step; must divide batch_size."""
    seq_len: int = field(default=128, metadata=always())
    """Tokens per sequence; at most the model's max_seq_len."""
    lr: float = field(default=3e-3, metadata=always())
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = field(default=0.1, metadata=always())
    """The schedule's floor as a fraction of lr: where the decay ends (cosine or wsd)."""
    warmup_steps: int = field(default=20, metadata=always())
    """Linear warmup steps (then the decay of ``schedule``)."""
    schedule_steps: int | None = field(default=None, metadata=unless_default(omit=_whole_schedule))
    """Steps of the learning-rate schedule when the run trains past it (None: ``steps``): the
    first ``schedule_steps`` steps are exactly those of a run of that many steps, and the rest
    train at the schedule's final learning rate, min_lr_ratio * lr. A study's
    ``baseline_extend`` sets it on the baseline's cells; in the key only when below ``steps``."""
    schedule: Schedule = field(default="cosine", metadata=unless_default())
    """After warmup: ``cosine`` (a cosine decay to min_lr_ratio * lr over the rest of the schedule)
    or ``wsd`` (warmup-stable-decay: lr held, then a linear decay to min_lr_ratio * lr over the
    schedule's last ``decay_steps``; ``ablate.train.schedule``). Up to its decay a wsd run does
    not depend on ``steps``, so the budgets of a study share it (decay branches,
    ``ablate.study.families``). In the key when wsd."""
    decay_fraction: float = field(default=0.2, metadata=always(omit=_not_wsd))
    """With ``schedule: wsd``, the fraction of the schedule's steps spent decaying, in (0, 1]:
    ``decay_steps`` = max(1, round(decay_fraction * steps)), of ``schedule_steps`` when set (round
    half to even). In the key only when the schedule is wsd."""
    weight_decay: float = field(default=0.1, metadata=always())
    """AdamW decoupled weight decay on matrices (not on norms and biases)."""
    beta1: float = field(default=0.9, metadata=always())
    beta2: float = field(default=0.95, metadata=always())
    eps: float = field(default=1e-8, metadata=always())
    grad_clip: float = field(default=1.0, metadata=always())
    """Clip the global gradient norm to this value (0: no clipping)."""
    eval_every: int = field(default=20, metadata=always())
    """Evaluate validation loss every N steps (also at step 0 and at the end)."""
    eval_batches: int = field(default=0, metadata=always())
    """Validation batches per evaluation (0: the whole held-out set)."""
    checkpoint_every: int = field(default=0, metadata=never())
    """Checkpoint every N steps (0: only at the end); needs RunConfig.checkpoint_dir."""
    precision: Precision = field(default="auto", metadata=always(resolve=_precision))
    """bf16: autocast to bfloat16; fp32: none; auto: bf16 on CUDA devices that support it, else fp32."""
    divergence_factor: float = field(default=2.0, metadata=always())
    """Diverged when the smoothed training loss exceeds this multiple of its best value."""
    compile: Compile = field(default="auto", metadata=unless_default(resolve=_on, neutral=False))
    """torch.compile the model (forward and backward, quantizers included): true, false, or auto
    (on for CUDA devices, off on the CPU, where the C kernel quantizes eagerly). A compiled run has
    it in its key (fused kernels round differently); an uncompiled one leaves it out."""
    fused_adamw: Compile = field(default="auto", metadata=unless_default(resolve=_on))
    """AdamW's fused kernel (one pass over all parameters; it skips a non-finite step on the
    device, with no host read): true, false, or auto (on for CUDA; off on the CPU, where the
    foreach kernels run). In the key when it differs from auto's choice for the device: it rounds
    differently from the foreach kernels (by one float32 ulp here and there)."""
    log_every: int | None = field(default=None, metadata=never())
    """Read the steps' losses and gradient norms on the host (and log them) every N steps, and at
    evaluations, probes, checkpoints and the end; between those a GPU queues steps without waiting
    for them. The divergence guard checks every step, up to N - 1 steps late (a diverged run stops
    there). None: 1 on the CPU (reading costs nothing there), 10 on CUDA. Not in the key: the
    numbers are the same."""
    workers: int = field(default=1, metadata=always(omit=_one_process))
    """Processes that train this run together (data parallel), each on its own device with
    batch_size / workers sequences of every step; a study sets it from ``resources.workers``. In
    the key when above 1 (each rank draws its own rounding noise: ``backends.layer.linear``)."""
    parallel: Parallel = field(
        default="auto", metadata=unless_default(resolve=_parallel, neutral="none")
    )
    """How the workers share the model: ddp (each holds all of it; gradients all-reduced), fsdp
    (FSDP2 ``fully_shard`` per transformer block: parameters, gradients and optimizer state
    sharded), none (one process), or auto (ddp when workers > 1, else none). ddp or fsdp with one
    worker runs the distributed code path in a process group of one (``ablate.train.parallel``)."""

    activation_checkpointing: Checkpointing = field(default="none", metadata=unless_default())
    """``blocks``: each transformer block's activations are recomputed in the backward instead of
    kept (``ablate.model.recompute``): the block's input is kept, and one block's activations are
    alive at a time. The recomputed forward draws the random streams of the original one, so a run
    is bit-identical with and without it (tested); in the key when on, so a grid can hold both."""

    fsdp_all_gather: AllGather = field(default="fp32", metadata=unless_default())
    """FSDP2's all-gather of the block linears' weights: fp32 (the master weights), or bf16: half
    the bytes, no autocast copy kept; needs bf16 precision, no compile; changes no number (tested
    bit-identical, ``ablate.train.parallel``). In the key when bf16."""
    rank_draws: RankDraws = field(default="per_rank", metadata=unless_default())
    """Data-parallel ranks' random draws for their own operands (X, dY: stochastic rounding) and
    wgrad's Hadamard signs: ``per_rank`` (each rank its own stream, ``backends.layer.streams``) or
    ``shared`` (every rank rank 0's, as Megatron draws them: the seed paper's multi-GPU noise).
    The weight's draws are shared either way. In the key when shared."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "seq_len", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "eval_batches"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name}: must be >= 0, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.grad_accum: {self.grad_accum} does not divide train.batch_size "
                f"{self.batch_size}; use a divisor of the batch size"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"train.lr: must be a positive finite number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"train.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(
                f"train.precision: unknown {self.precision!r}; allowed: auto, bf16, fp32"
            )
        if self.schedule_steps is not None and not 1 <= self.schedule_steps <= self.steps:
            raise ValueError(
                f"train.schedule_steps: must be in [1, train.steps = {self.steps}] (or null: "
                f"train.steps), got {self.schedule_steps}"
            )
        self._check_schedule()
        if self.log_every is not None and self.log_every < 1:
            raise ValueError(f"train.log_every: must be >= 1 (or null: auto), got {self.log_every}")
        for name in ("compile", "fused_adamw"):
            if getattr(self, name) not in ("auto", True, False):
                raise ValueError(
                    f"train.{name}: unknown {getattr(self, name)!r}; allowed: auto, true, false"
                )
        if self.activation_checkpointing not in get_args(Checkpointing):
            raise ValueError(
                f"train.activation_checkpointing: unknown {self.activation_checkpointing!r}; "
                f"allowed: {', '.join(get_args(Checkpointing))}"
            )
        if self.fsdp_all_gather not in get_args(AllGather):
            raise ValueError(
                f"train.fsdp_all_gather: unknown {self.fsdp_all_gather!r}; "
                f"allowed: {', '.join(get_args(AllGather))}"
            )
        if self.rank_draws not in get_args(RankDraws):
            raise ValueError(
                f"train.rank_draws: unknown {self.rank_draws!r}; "
                f"allowed: {', '.join(get_args(RankDraws))}"
            )
        if self.rank_draws == "shared" and self.resolved_parallel == "none":
            raise ValueError(
                "train.rank_draws: shared is how data-parallel ranks draw, but train.parallel "
                "is none (one process draws alike either way); drop it or train with ddp/fsdp"
            )
        if self.fsdp_all_gather == "bf16" and self.resolved_parallel != "fsdp":
            raise ValueError(
                "train.fsdp_all_gather: bf16 is how FSDP2 all-gathers the weights, but "
                f"train.parallel is {self.resolved_parallel}; use train.parallel: fsdp, or "
                "fsdp_all_gather: fp32"
            )
        if self.divergence_factor <= 1:
            raise ValueError(f"train.divergence_factor: must be > 1, got {self.divergence_factor}")
        if self.workers < 1:
            raise ValueError(f"resources.workers: must be >= 1, got {self.workers}")
        if self.parallel not in get_args(Parallel):
            raise ValueError(
                f"train.parallel: unknown {self.parallel!r}; allowed: {', '.join(get_args(Parallel))}"
            )
        if self.workers > 1 and self.parallel == "none":
            raise ValueError(
                f"train.parallel: none trains in one process, but resources.workers is "
                f"{self.workers}; use ddp or fsdp (or auto: ddp), or resources.workers: 1"
            )
        if self.batch_size % (self.workers * self.grad_accum):
            raise ValueError(
                f"train.batch_size: {self.batch_size} sequences do not split into "
                f"resources.workers x train.grad_accum = {self.workers} x {self.grad_accum} equal "
                "micro-batches; use a multiple of their product"
            )

    def _check_schedule(self) -> None:
        if self.schedule not in get_args(Schedule):
            raise ValueError(
                f"train.schedule: unknown {self.schedule!r}; allowed: {', '.join(get_args(Schedule))}"
            )
        f = self.decay_fraction
        if isinstance(f, bool) or not (isinstance(f, int | float) and 0 < f <= 1):
            raise ValueError(f"train.decay_fraction: must be in (0, 1], got {f!r}")
        stable = self.schedule_end - self.warmup_steps
        of = "train.schedule_steps" if self.schedule_steps is not None else "train.steps"
        if self.schedule == "wsd" and stable <= 0:
            raise ValueError(
                f"train.warmup_steps: {self.warmup_steps} leaves no step of {of} = "
                f"{self.schedule_end} after warmup for a wsd schedule's decay; lower "
                f"train.warmup_steps below {self.schedule_end} or raise {of}"
            )
        if self.schedule == "wsd" and self.decay_steps > stable:
            raise ValueError(
                f"train.decay_fraction: a decay of {self.decay_steps} steps (max(1, round("
                f"{f:g} x {of} = {self.schedule_end}))) is longer than the {max(stable, 0)} steps "
                f"after warmup ({of} - train.warmup_steps = {self.schedule_end} - "
                f"{self.warmup_steps}); lower train.decay_fraction or train.warmup_steps"
            )

    @property
    def decay_steps(self) -> int:
        """Steps of a wsd schedule's decay, the last of its schedule: max(1, round(decay_fraction
        x ``schedule_end``)); 0 under cosine."""
        if self.schedule != "wsd":
            return 0
        return max(1, round(self.decay_fraction * self.schedule_end))

    @property
    def decay_start(self) -> int | None:
        """The steps a wsd run trains before its decay (``schedule_end - decay_steps``): its state
        after them is that of any wsd run of the same config with a later decay; None under
        cosine, whose every step depends on ``steps``."""
        if self.schedule != "wsd":
            return None
        return self.schedule_end - self.decay_steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def schedule_end(self) -> int:
        """The last step of the learning-rate schedule: ``schedule_steps``, else ``steps``. A run
        up to here is an ordinary run of this many steps, step for step."""
        return self.steps if self.schedule_steps is None else self.schedule_steps

    def eval_due(self, step: int) -> bool:
        """Whether the loop evaluates after optimizer step ``step``: every ``eval_every`` steps,
        at the end of the schedule (the last evaluation of an ordinary run) and at the last step."""
        return step % self.eval_every == 0 or step in (self.steps, self.schedule_end)

    @property
    def micro_batch(self) -> int:
        """Sequences in one forward of one worker: ``batch_size / workers / grad_accum`` (training's
        micro-batch, and evaluation's)."""
        return self.batch_size // (self.workers * self.grad_accum)

    @property
    def resolved_parallel(self) -> Literal["none", "ddp", "fsdp"]:
        """``parallel`` with auto resolved: ddp when workers > 1, else none."""
        if self.parallel == "auto":
            return "ddp" if self.workers > 1 else "none"
        return self.parallel


def _recipe(r: Recipe, run: RunConfig, kind: str) -> dict[str, Any]:
    return r.to_dict()


def _phases(v: tuple[Phase, ...], run: RunConfig, kind: str) -> list[dict[str, Any]]:
    return [p.key() for p in v]


def _kind(v: str, run: RunConfig, kind: str) -> str:
    return kind


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything one training run depends on."""

    model: ModelConfig = field(default_factory=ModelConfig, metadata=always())
    data: DataConfig = field(default_factory=DataConfig, metadata=always())
    train: TrainConfig = field(default_factory=TrainConfig, metadata=always())
    recipe: Recipe = field(default_factory=Recipe.bf16, metadata=always(resolve=_recipe))
    """Numerics of every block linear (see backends.recipes.recipe); in the key as its canonical
    serialisation."""
    phases: tuple[Phase, ...] = field(default=(), metadata=unless_default(resolve=_phases))
    """Steps trained under another recipe (``ablate.train.phases``: an FP8 warmup, a BF16 tail),
    in order, without overlap; those that change nothing are dropped. In the key only when there
    are any: a run without phases keeps its key."""
    backend: str = field(default="emulated", metadata=always())
    """GEMM backend: emulated (any device) or native (the hardware's FP8/FP4 GEMMs; see backends.gemm.native)."""
    quantizer_graph: QuantizerGraph = field(
        default="auto",
        metadata=unless_default(resolve=_quantizer_graph, neutral="opaque"),
    )
    """How a compiled model (``train.compile``) holds its quantizers: ``opaque`` (one op node per
    quantized operand, each a Python call into the quantizer's own compiled kernels: a block
    compiles fast), ``inline`` (the quantizer's arithmetic traced into the block's graph: it fuses
    with its neighbours and costs no Python call, and compiles longer), or auto (inline on CUDA,
    where the opaque ops left an H200 idle half of an MXFP4 step; opaque on the CPU, whose C kernel
    quantizes faster than the traced arithmetic and whose compile of an inline block takes
    minutes). In the key only for a compiled run with quantized GEMMs that traces inline: the
    fused arithmetic around the quantizer rounds differently."""
    seed: int = field(default=0, metadata=always())
    """Initial weights, stochastic-rounding and batch-order seed (unless data.data_seed is set)."""
    device: str = field(default="auto", metadata=always(resolve=_kind, name="device_kind"))
    """cpu, cuda, cuda:N, or auto (cuda when available). In the key as its kind (cpu, cuda), not
    which device of that kind."""
    checkpoint_dir: str | None = field(default=None, metadata=never())
    """Where checkpoints go; a run finding one there resumes from it."""
    data_cache: str | None = field(default=None, metadata=never())
    """The folder of prepared data (``ablate.data.prepared``; None: ``$ABLATE_DATA_CACHE``, else
    ``~/.cache/ablate/data``). Like ``checkpoint_dir``, not part of the run's key nor its params."""
    probe: ProbeConfig | None = field(default=None, metadata=never())
    """Gradient-fidelity probes (None: off). Not part of the run's key, nor of its params."""

    def __post_init__(self) -> None:
        if self.data.data_seed is None:  # the batch order follows the seed (on a copy: one
            self.data = copy.copy(self.data)  # DataConfig may serve the configs of several seeds)
            self.data.data_seed = self.seed
        if self.quantizer_graph not in get_args(QuantizerGraph):
            raise ValueError(
                f"quantizer_graph: unknown {self.quantizer_graph!r}; allowed: "
                f"{', '.join(get_args(QuantizerGraph))}"
            )
        check_device_name(self.device)
        check(self.phases, self.train.steps)
        self.phases = normalized(self.phases, self.recipe)
        if not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed: must be in [0, 2^32), got {self.seed}")
        if self.data.val_tokens < self.train.seq_len + 1:
            raise ValueError(
                f"data.val_tokens: {self.data.val_tokens} held-out tokens make no validation window "
                f"of train.seq_len + 1 = {self.train.seq_len + 1} tokens; raise data.val_tokens "
                "or lower train.seq_len"
            )
        if self.train.fsdp_all_gather == "bf16":
            self._check_bf16_all_gather()
        if self.model.hf is not None:  # its positions and attention window (ablate.model.hf)
            check_config(self.model.hf, vocab_size=None, seq_len=self.train.seq_len)
            if self.model.init == "pretrained":
                check_weights(self.model.hf)
        preset = PRESETS.get(self.model.preset or "")
        max_len = self.model.max_seq_len or (preset.max_seq_len if preset else None)
        if max_len is not None and self.train.seq_len > max_len:
            raise ValueError(
                f"train.seq_len: {self.train.seq_len} is longer than the model supports "
                f"(model.max_seq_len = {max_len}); shorten it or raise model.max_seq_len"
            )

    def _check_bf16_all_gather(self) -> None:
        kind = device_kind(self.device)
        precision = resolved_precision(self.train.precision, kind)
        if precision != "bf16":
            why = f"needs bf16 precision (autocast), but train.precision {self.train.precision!r}"
            fix = f"is {precision} on {kind}; set train.precision: bf16"
        elif resolved_compile(self.train.compile, kind):
            why = "makes each block linear an FSDP2 unit, whose hooks a compiled block cannot trace"
            fix = f"(train.compile: {self.train.compile} on {kind}); set train.compile: false"
        else:
            return
        raise ValueError(f"train.fsdp_all_gather: bf16 {why} {fix}, or fsdp_all_gather: fp32")

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON-able); ``from_dict`` inverts it."""
        return (
            {
                "model": self.model.to_dict(),
                "data": dataclasses.asdict(self.data),
                "train": dataclasses.asdict(self.train),
                "recipe": self.recipe.to_dict(),
                "phases": [p.to_dict() for p in self.phases],
                "backend": self.backend,
                "seed": self.seed,
                "device": self.device,
                "checkpoint_dir": self.checkpoint_dir,
            }
            | ({"data_cache": self.data_cache} if self.data_cache is not None else {})
            | ({"probe": self.probe.to_dict()} if self.probe is not None else {})
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(
                f"unknown run config key(s) {sorted(unknown)}; allowed: {', '.join(sorted(known))}"
            )
        return cls(
            model=ModelConfig(**d.get("model", {})),
            data=DataConfig(**d.get("data", {})),
            train=TrainConfig(**d.get("train", {})),
            recipe=Recipe.from_dict(d["recipe"]) if "recipe" in d else Recipe.bf16(),
            phases=tuple(Phase.from_dict(p) for p in d.get("phases") or ()),
            backend=d.get("backend", "emulated"),
            seed=d.get("seed", 0),
            device=d.get("device", "auto"),
            checkpoint_dir=d.get("checkpoint_dir"),
            data_cache=d.get("data_cache"),
            probe=ProbeConfig(**d["probe"]) if d.get("probe") is not None else None,
        )


KEY_EXCLUDED = (
    "checkpoint_dir", "data_cache", "device", "train.checkpoint_every", "train.log_every"
)  # fmt: skip
"""RunConfig fields that do not change a run's numbers: not in its key, not logged as params (a
study can change how often it checkpoints, or move its output folder, and keep its results).
``probe`` is left out of both the same way (``config_hash``, ``run_params``)."""


def config_hash(cfg: RunConfig, numerics: int = NUMERICS_VERSION) -> str:
    """A run's identity, its cell key: a hash of everything that changes its numbers, each field
    by the rule it declares (``ablate.key``): the resolved config less what changes no number,
    with the device *kind* (cpu or cuda, not which GPU) and the resolved precision; stable across
    YAML spelling and order. It holds the numerics version (``ablate.numerics``): ``numerics=``
    an older one gives the key the same cell had then (version 1 held none)."""
    d = key_fields(cfg, device_kind(cfg.device))
    if numerics >= FIRST_KEYED:
        d["numerics"] = numerics
    return digest(d)


def probe_problems(probe: ProbeConfig, run: RunConfig) -> list[str]:
    """What stops ``probe`` on ``run``'s model and data (each line names its path)."""
    tc = run.train
    n_layers = run.model.resolved().n_layers
    return probe.problems(
        n_layers=n_layers,
        seq_len=tc.seq_len,
        batch_size=tc.batch_size,
        val_tokens=run.data.val_tokens,
    )


def run_params(cfg: RunConfig) -> dict[str, Any]:
    """The flattened config a run records as params (``KEY_EXCLUDED`` left out: they may change
    between a run's attempts; unset fields (None, e.g. a preset's dimensions) left out: the
    resolved model is in ``model.n_params`` and ``config.json``; ``probe`` left out: it may be
    switched on for a resumed run; ``train.decay_fraction`` only under wsd, where it means
    something)."""
    d = cfg.to_dict()
    d.pop("probe", None)
    if cfg.train.schedule != "wsd":
        del d["train"]["decay_fraction"]
    return {k: v for k, v in flatten(d).items() if k not in KEY_EXCLUDED and v is not None}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
