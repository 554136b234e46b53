"""The training loop: ``train(config, logger) -> RunResult``.

AdamW with linear warmup and a cosine or warmup-stable-decay schedule (``schedule``), gradient
clipping and accumulation, bfloat16 autocast where the device supports it (``device``), validation
loss/perplexity on the fixed held-out set (at step 0, every ``eval_every`` steps and at the end),
tokens seen as the x-axis of everything, and a divergence guard (non-finite loss or gradient norm,
or a smoothed loss that runs away) that ends the run as ``diverged`` with the step instead of
raising. With ``config.probe`` set, gradient-fidelity probes (``probe``) run at their steps and log
beside the step's metrics.

Metrics, against the step: train_loss, lr, grad_norm, tokens, tokens_per_s; val_loss and val_ppl
at evaluations (the untrained model's step-0 perplexity as init_val_ppl, so that it does not squash
the UI's charts), and each evaluation again as val_loss_by_tokens / val_ppl_by_tokens with the tokens
seen as the step, so the MLflow UI can chart validation against tokens. Params: the flattened
config (``run_params``), data.fingerprint, data.prepared, model.n_params and
model.n_params_non_embedding (N of scaling laws: blocks and final norm); D is the tokens metric.

GPU-grade execution: the model is compiled where ``train.compile`` says (``auto``: on CUDA; per
block and head, before DDP or FSDP wraps it: ``compiling``), AdamW is fused where
``train.fused_adamw`` says (``auto``: on CUDA; it skips a non-finite step on the device, through
``found_inf``), the matmul policy is explicit (``device.numerics_policy``: no TF32), batches reach
a GPU from page-locked memory, evaluation runs in training's micro-batches, and a step never waits
for the device: losses and gradient norms stay on it until the next read, every
``train.log_every`` steps and at evaluations, probes, checkpoints and the end, one transfer for the
steps since the last.

Data parallel (``train.parallel`` ddp or fsdp, ``train.workers`` ranks in a process group that Ray
Train or ``parallel.process_group`` made): each rank trains its rows of every global batch, the
logged loss and gradient norm are averaged over the ranks, evaluations are split the same way, the
checkpoints are sharded (``checkpoint.save_sharded``), and only the logger of rank 0 records
(``parallel``).

The run's progress is a ``TrainState`` (``state``); checkpoints (``checkpoint``) are atomic and hold
everything the next step depends on. A run that finds a checkpoint in ``checkpoint_dir`` resumes
from it and ends bit-identical to an uninterrupted run on the same CPU (same thread count); one that
finds a damaged one sets it aside (kept) and trains from step 0; one that
finds a finished run's checkpoint returns its result without training. A wsd run given
``branches`` (``branch``) saves the branch checkpoints of its family's shorter budgets on its way
(a trunk), or starts from its own branch point where it has no checkpoint (a branch).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ablate.data import BatchSampler, TokenData, load_data, val_batches
from ablate.model import build_model, count_non_embedding, count_parameters, set_checkpointing
from ablate.train.branch import Branches, load_branch, save_branch
from ablate.train.checkpoint import load_checkpoint, load_sharded, save_checkpoint, save_sharded
from ablate.train.compiling import compile_model, warn_slow_gemms
from ablate.train.config import (
    RunConfig,
    TrainConfig,
    config_hash,
    resolved_compile,
    resolved_log_every,
    resolved_precision,
    resolved_quantizer_graph,
    run_params,
)
from ablate.train.device import autocast, numerics_policy, resolve_device
from ablate.train.logger import Logger, NullLogger
from ablate.train.parallel import Ranks, ranks_of
from ablate.train.phases import quantizes, recipe_at, switches
from ablate.train.probe import make_prober
from ablate.train.result import EvalPoint, RunResult
from ablate.train.schedule import lr_at
from ablate.train.state import TrainState
from backends import Recipe
from backends.layer import check_recipe, set_recipe
from backends.quant.ops import set_traced_inline

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class _Step:
    """One optimizer step as it was queued: its loss and gradient norm still on the device."""

    step: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    tokens: int


def train(
    config: RunConfig,
    logger: Logger | None = None,
    *,
    stop_after: int | None = None,
    branches: Branches | None = None,
    stop: Callable[[], bool] | None = None,
) -> RunResult:
    """Train one configuration; ``stop_after`` ends the run (status ``stopped``, checkpointed) once
    that many steps are done, as an interruption would. ``branches``: as a family's trunk, save
    branch checkpoints on the way; as a branch, start from one (``ablate.train.branch``). ``stop``
    is asked after every step: when it says True (a job about to be preempted) the run logs the
    steps done, checkpoints and ends ``stopped`` there, so that a resumed run recomputes nothing
    and logs no step twice."""
    run = build_run(config, logger if logger is not None else NullLogger(), stop_after, branches)
    log, tc = run.log, config.train
    state = run.maybe_resume()
    if state.status in ("finished", "diverged"):
        return run.result(state)  # already done: nothing to train, nothing to log again
    state.status = None
    if config.probe is not None and run.ranks.distributed:
        raise ValueError("probe: probes run in one process (train.parallel: none)")
    prober = make_prober(config, run.model, run.data.val, run.ctx)  # None: probes off

    params = run_params(config)
    params.update(
        {
            "data.fingerprint": run.data.fingerprint,
            "data.prepared": run.data.prepared,
            "model.n_params": run.n_params,
            "model.n_params_non_embedding": run.n_params_non_embedding,
        }
    )
    log.log_params(params)
    if state.step == 0 and not state.evals:
        m0: dict[str, float] = {"tokens": 0.0}
        run.record_eval(state, m0)
        # the untrained model's perplexity (about the vocabulary size) would squash every val_ppl
        # chart in the UI: it is logged as init_val_ppl; val_loss keeps step 0 for the report
        m0["init_val_ppl"] = m0.pop("val_ppl")
        if prober is not None and prober.due(0):
            m0.update(prober.run())
        log.log_metrics(m0, 0)

    run.model.train()
    log_every = resolved_log_every(tc.log_every, run.device.type)
    pending: list[_Step] = []
    while state.step < tc.steps:
        if stop_after is not None and state.step >= stop_after:
            run.checkpoint(state)
            log.log_status("stopped", {"step": state.step})
            return run.result(state)
        pending.append(run.optimizer_step(state))
        step = state.step
        stopping = stop is not None and step < tc.steps and stop()
        read_now = (
            stopping
            or step % log_every == 0
            or tc.eval_due(step)
            or step == tc.steps
            or (prober is not None and prober.due(step))
            or (tc.checkpoint_every and step % tc.checkpoint_every == 0)
            or (stop_after is not None and step >= stop_after)
            or step in run.branch_steps
        )
        if not read_now:
            continue
        steps, pending = run.read(pending, state), []
        for s_i, loss, grad_norm, m in steps:
            reason = _divergence(state, tc, run.data.vocab_size, loss, grad_norm, s_i)
            if reason:
                log.log_metrics(m, s_i)
                state.status, state.reason, state.diverged_at = "diverged", reason, s_i
                run.checkpoint(state)
                log.log_status("diverged", {"step": s_i, "reason": reason})
                return run.result(state)
            if s_i != step:  # this step's own metrics go out below, with the rest of its record
                log.log_metrics(m, s_i)
        metrics = steps[-1][3]
        metrics["tokens_per_s"] = state.tokens / state.train_time  # the read waited for the device
        if tc.eval_due(step):
            run.record_eval(state, metrics)
            # the same evaluation with the tokens seen as its step: MLflow charts it against
            # tokens (runs with other batch sizes share that axis, not the step)
            by_tokens = {
                "val_loss_by_tokens": metrics["val_loss"],
                "val_ppl_by_tokens": metrics["val_ppl"],
            }
            log.log_metrics(by_tokens, int(state.tokens))
        if prober is not None and prober.due(step):
            metrics.update(prober.run(step_seconds=state.train_time / state.step))
        log.log_metrics(metrics, step)
        if step in run.branch_steps:
            run.save_branch(state)
        if step == tc.steps:
            state.status = "finished"
            run.checkpoint(state)
        elif stopping or (tc.checkpoint_every and step % tc.checkpoint_every == 0):
            run.checkpoint(state)
        if stopping:
            log.log_status("stopped", {"step": state.step})
            return run.result(state)
    state.status = "finished"
    res = run.result(state)
    log.log_status(
        "finished",
        {"step": state.step, "val_loss": res.final_val_loss, "tokens_per_s": res.tokens_per_s},
    )
    return res


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: list[Batch],
    ctx_fn: Callable[[], AbstractContextManager[Any]],
    ranks: Ranks | None = None,
    micro_batch: int | None = None,
) -> float:
    """Mean validation loss over the fixed held-out batches, token-weighted (a short last batch
    counts by its tokens). Each rank evaluates its rows of every batch (``ranks``) in forwards of at
    most ``micro_batch`` sequences, training's micro-batch: evaluation never holds more than a
    training forward does (the fp32 log-probabilities of the vocabulary are the largest part);
    None: the rank's rows in one forward. The sums stay on the device until the end (one read).

    Every rank runs the same number of forwards (FSDP's forward is a collective): a rank whose
    share of a chunk is empty runs it on one row with weight 0."""
    was_training = model.training
    model.eval()
    ranks = ranks if ranks is not None else Ranks()
    device = batches[0][0].device
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # token-weighted loss, tokens
    for x, y in batches:
        xr, yr = ranks.rows(x), ranks.rows(y)
        widest = -(-x.shape[0] // ranks.world)  # the most rows any rank has of this batch
        chunks = max(1, -(-widest // micro_batch)) if micro_batch else 1
        for xc, yc in zip(xr.tensor_split(chunks), yr.tensor_split(chunks), strict=True):
            n = yc.numel()
            if n == 0:  # this rank has no rows here: a forward anyway, weighted 0
                xc, yc = x[:1], y[:1]
            with ctx_fn():
                loss = model(xc, yc)
            sums[0] += loss.detach().double() * n  # scalars, no host-to-device copy
            sums[1] += n
    total, count = ranks.sum(sums).tolist()
    model.train(was_training)
    return total / count


@dataclass(kw_only=True, slots=True)
class Run:
    """What ``train`` builds once for a configuration (model, optimizer, data, validation batches)
    and where it reports and checkpoints; its methods are the steps of the loop."""

    config: RunConfig
    log: Logger
    device: torch.device
    ranks: Ranks
    """This process's rank in a distributed run (``Ranks()`` in one process)."""
    data: TokenData
    model: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: BatchSampler
    val: list[Batch]
    """The fixed validation batches, on ``device``."""
    n_params: int
    n_params_non_embedding: int
    """N of scaling laws: the blocks and the final norm (``ablate.model.non_embedding_params``)."""
    checkpoint_dir: Path | None
    branches: Branches | None
    """Its family's branch checkpoints: those it saves (a trunk) or starts from (a branch)."""
    config_hash: str
    t_start: float
    """``time.perf_counter()`` when ``train`` was called (the result's wall time)."""
    recipe: Recipe | None = None
    """The recipe the model trains under now (a precision schedule switches it: ``follow``);
    None: a plain model, which no recipe of the run quantizes."""

    def follow(self, step: int, *, record: bool = True) -> None:
        """Put the model under the recipe that trains optimizer step ``step`` (``phases``), and
        record where the recipe changes: the metric ``recipe_phase`` at the switch's step (0: the
        run's own recipe, i: ``phases[i - 1]``; at step 0 too)."""
        cfg = self.config
        if self.recipe is None:
            return
        want = recipe_at(cfg.phases, cfg.recipe, step)
        if want is not self.recipe:
            set_recipe(self.model, want)
            self.recipe = want
        if (
            record
            and cfg.phases
            and (step == 0 or recipe_at(cfg.phases, cfg.recipe, step - 1) is not want)
        ):
            phase = next((i + 1 for i, p in enumerate(cfg.phases) if p.recipe is want), 0)
            self.log.log_metrics({"recipe_phase": float(phase)}, step)

    def ctx(self) -> AbstractContextManager[Any]:
        """The autocast context of one forward pass."""
        return autocast(self.config.train.precision, self.device)

    @property
    def branch_steps(self) -> tuple[int, ...]:
        """The steps at which this run saves a branch checkpoint (a family's trunk)."""
        return self.branches.save_at if self.branches is not None else ()

    def maybe_resume(self) -> TrainState:
        """The checkpoint's state, with model, optimizer, data position and RNGs restored from it;
        without one, a branch's state at its branch point (``branch.load_branch``); else a fresh
        state."""
        kw: dict[str, Any] = dict(model=self.model, optimizer=self.optimizer, sampler=self.sampler)
        own = dict(config_hash=self.config_hash, set_aside_damaged=True, **kw)
        state = None  # a damaged checkpoint set aside: step 0, not a branch's
        if self.checkpoint_dir is not None and self.ranks.distributed:
            state = load_sharded(self.checkpoint_dir, ranks=self.ranks, **own)
        elif self.checkpoint_dir is not None:
            state = load_checkpoint(self.checkpoint_dir, **own)
        if state is None and self.branches is not None:
            state = load_branch(self.branches, ranks=self.ranks, **kw)
            cfg, upto = self.config, state.step if state is not None else 0
            for step in (0, *switches(cfg.phases, cfg.recipe, cfg.train.steps)):
                if step < upto:  # its phases up to there (the trunk's curve has the trunk's)
                    self.follow(step)
        return state if state is not None else TrainState()

    def optimizer_step(self, state: TrainState) -> _Step:
        """Queue one optimizer step (scheduled LR, gradient accumulation, clipping) and advance
        ``state``; a non-finite loss or gradient norm leaves the weights as they were. The loss and
        gradient norm stay on the device (``read`` brings them over)."""
        tc = self.config.train
        t0 = time.perf_counter()
        self.follow(state.step)
        lr = lr_at(state.step, tc)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        x, y = self.sampler.next()  # the global batch: this rank trains its rows
        x, y = self.ranks.rows(x), self.ranks.rows(y)
        if self.device.type == "cuda":  # from page-locked memory: a copy the step need not wait for
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        micro = zip(x.chunk(tc.grad_accum), y.chunk(tc.grad_accum), strict=True)
        for i, (xm, ym) in enumerate(micro):
            with self.ranks.accumulating(self.model, last=i == tc.grad_accum - 1):
                with self.ctx():
                    loss = self.model(xm, ym)
                (loss / tc.grad_accum).backward()
            loss_sum += loss.detach().float() / tc.grad_accum
        clip = tc.grad_clip if tc.grad_clip > 0 else math.inf
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), clip).detach()
        if self.ranks.distributed:  # every rank: the same mean loss, the same norm
            if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor
                grad_norm = grad_norm.full_tensor()
            loss_sum, grad_norm = self.ranks.mean(torch.stack([loss_sum, grad_norm.float()]))
        finite = torch.isfinite(loss_sum) & torch.isfinite(grad_norm)
        if self.optimizer.defaults.get("fused"):  # the kernel skips the update on the device
            self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
            self.optimizer.step()
        elif bool(finite):  # the CPU: reading costs nothing
            self.optimizer.step()
        state.step += 1
        state.tokens += tc.tokens_per_step
        state.train_time += time.perf_counter() - t0
        return _Step(state.step, loss_sum, grad_norm, lr, state.tokens)

    def read(
        self, steps: list[_Step], state: TrainState
    ) -> list[tuple[int, float, float, dict[str, float]]]:
        """The queued steps' (step, loss, gradient norm, metrics), in one transfer from the device
        (which waits for it: the wait counts as training time)."""
        t0 = time.perf_counter()
        values = torch.stack([v for s in steps for v in (s.loss, s.grad_norm)]).tolist()
        state.train_time += time.perf_counter() - t0
        out = []
        for i, s in enumerate(steps):
            loss, grad_norm = values[2 * i], values[2 * i + 1]
            metrics = {"train_loss": loss, "lr": s.lr, "grad_norm": grad_norm, "tokens": s.tokens}
            out.append((s.step, loss, grad_norm, metrics))
        return out

    def record_eval(self, state: TrainState, metrics: dict[str, float]) -> None:
        """Evaluate, append to the state's history and add val_loss/val_ppl to ``metrics``: under
        the recipe that trained the last step."""
        self.follow(max(state.step - 1, 0), record=False)
        loss = evaluate(self.model, self.val, self.ctx, self.ranks, self.config.train.micro_batch)
        state.evals.append(EvalPoint(step=state.step, tokens=state.tokens, val_loss=loss))
        metrics.update(val_loss=loss, val_ppl=math.exp(min(loss, 700.0)))

    def checkpoint(self, state: TrainState) -> None:
        """Checkpoint the run (nothing without a ``checkpoint_dir``)."""
        if self.checkpoint_dir is None:
            return
        # the steps up to this checkpoint are stored before it exists: a resumed run re-reports
        # only later steps (a kill after the flush and before the write re-reports logged steps,
        # which the logger drops)
        self.log.flush()
        kw: dict[str, Any] = dict(
            config_hash=self.config_hash,
            state=state,
            model=self.model,
            optimizer=self.optimizer,
            sampler=self.sampler,
        )
        if self.ranks.distributed:
            save_sharded(self.checkpoint_dir, ranks=self.ranks, **kw)
        else:
            save_checkpoint(self.checkpoint_dir, **kw)

    def save_branch(self, state: TrainState) -> None:
        """The trunk: save the branch checkpoint of this step, its steps' metrics stored first (a
        branch copies the trunk's curve up to here once the checkpoint exists)."""
        assert self.branches is not None
        self.log.flush()
        kw: dict[str, Any] = dict(model=self.model, optimizer=self.optimizer, sampler=self.sampler)
        save_branch(self.branches, state=state, ranks=self.ranks, **kw)

    def result(self, state: TrainState) -> RunResult:
        return RunResult(
            status=state.status or "stopped",
            steps=state.step,
            tokens=state.tokens,
            evals=list(state.evals),
            tokens_per_s=state.tokens / state.train_time if state.train_time else 0.0,
            fingerprint=self.data.fingerprint,
            diverged_at=state.diverged_at,
            reason=state.reason,
            wall_time_s=time.perf_counter() - self.t_start,
            n_params=self.n_params,
        )


def build_run(
    config: RunConfig, log: Logger, stop_after: int | None, branches: Branches | None = None
) -> Run:
    """Check the arguments, load the data, build model and optimizer, and cut the validation set."""
    t_start = time.perf_counter()
    tc = config.train
    device = resolve_device(config.device)
    numerics_policy()
    data = load_data(config.data, cache=config.data_cache)
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after: must be >= 0, got {stop_after}")
    ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    if (tc.checkpoint_every or stop_after is not None) and ckpt_dir is None:
        raise ValueError("checkpoint_dir: needed for train.checkpoint_every and stop_after")
    if branches is not None:
        branches.check(config)  # a member of the family, one process

    own = quantizes(config.phases, config.recipe)  # the model is converted if any phase quantizes
    model = build_model(
        config.model,
        data.vocab_size,
        recipe=own,
        backend=config.backend,
        seed=config.seed,
        device=device,
        seq_len=tc.seq_len,
    )
    for p in config.phases:  # each phase's recipe checked before anything trains
        if own is not None and p.recipe != own:
            check_recipe(model, p.recipe, config.backend)
    n_params = count_parameters(model)  # before FSDP shards them
    n_non_embedding = count_non_embedding(model)
    set_checkpointing(model, tc.activation_checkpointing)  # before compile, DDP and FSDP2
    if resolved_compile(tc.compile, device.type):
        # per block and head, in place, before DDP or FSDP2 wraps the model (``compiling`` says
        # why); checkpoint names stay those of the eager model
        warn_slow_gemms(model, device, _compute_dtype(config, device))
        graph = resolved_quantizer_graph(config.quantizer_graph, tc.compile, device.type)
        set_traced_inline(graph == "inline")  # read as Dynamo traces the blocks
        compile_model(model)
    ranks = ranks_of(config)
    shared = ranks.wrap(model, device)  # DDP's wrapper, or the model itself (FSDP shards it)
    opt = torch.optim.AdamW(
        _param_groups(shared, tc.weight_decay),
        lr=tc.lr,
        betas=(tc.beta1, tc.beta2),
        eps=tc.eps,
        fused=True if resolved_compile(tc.fused_adamw, device.type) else None,
    )
    assert config.data.data_seed is not None  # a RunConfig resolves it (the run's seed)
    sampler = BatchSampler(data.train, tc.seq_len, tc.batch_size, config.data.data_seed)
    val = val_batches(data.val, tc.seq_len, tc.batch_size)
    if tc.eval_batches:
        val = val[: tc.eval_batches]
    if not val:
        raise ValueError(
            f"data.val_tokens: {data.val.numel()} held-out tokens make no validation batch of "
            f"{tc.batch_size} x {tc.seq_len}; raise data.val_tokens or lower the batch"
        )
    return Run(
        config=config,
        log=log,
        device=device,
        ranks=ranks,
        data=data,
        model=shared,
        optimizer=opt,
        sampler=sampler,
        val=[(x.to(device), y.to(device)) for x, y in val],
        n_params=n_params,
        n_params_non_embedding=n_non_embedding,
        checkpoint_dir=ckpt_dir,
        branches=branches,
        config_hash=config_hash(config),
        t_start=t_start,
        recipe=own,
    )


def _compute_dtype(config: RunConfig, device: torch.device) -> torch.dtype:
    """The dtype of the GEMMs' high-precision operands: bfloat16 under autocast, else float32."""
    bf16 = resolved_precision(config.train.precision, device.type) == "bf16"
    return torch.bfloat16 if bf16 else torch.float32


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on norms and biases."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _divergence(
    state: TrainState, tc: TrainConfig, vocab_size: int, loss: float, grad_norm: float, step: int
) -> str:
    """The divergence guard, for step ``step``: why the run diverged, or "" when it did not.
    Updates the smoothed loss (``state.ema``) and its best value after warmup
    (``state.best_ema``)."""
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return f"non-finite loss ({loss}) or gradient norm ({grad_norm})"
    state.ema = loss if state.ema is None else 0.9 * state.ema + 0.1 * loss
    if step > tc.warmup_steps:
        state.best_ema = min(state.best_ema, state.ema)
    loss_ceiling = 3.0 * math.log(vocab_size)  # far worse than a uniform prediction
    if loss > loss_ceiling:
        return f"loss {loss:.3g} exceeds 3 ln(vocab) = {loss_ceiling:.3g}"
    if state.ema > tc.divergence_factor * state.best_ema:
        return (
            f"smoothed loss {state.ema:.3g} exceeds {tc.divergence_factor} x its best "
            f"{state.best_ema:.3g}"
        )
    return ""
