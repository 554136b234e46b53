"""The training loop: ``train(config, logger) -> RunResult``.

AdamW with linear warmup and cosine decay, gradient clipping and accumulation, bfloat16 autocast
where the device supports it, validation loss/perplexity on the fixed held-out set (at step 0, every
``eval_every`` steps and at the end), tokens seen as the x-axis of everything, and a divergence guard
(non-finite loss or gradient norm, or a smoothed loss that runs away) that ends the run as
``diverged`` with the step instead of raising.

Checkpoints are atomic (written to a temporary file, then renamed) and hold everything the next step
depends on: model (including the quantized layers' random-stream counters), optimizer, data position,
RNG states, evaluation history and the divergence guard's state. A run that finds a checkpoint in
``checkpoint_dir`` resumes from it and ends bit-identical to an uninterrupted run on the same CPU
(same thread count); one that finds a finished run's checkpoint returns its result without training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import EvalPoint, RunConfig, RunResult
from .data import BatchSampler, load_data, val_batches
from .logger import Logger, NullLogger
from .model import build_model, count_parameters

CHECKPOINT = "checkpoint.pt"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device: unknown {name!r}; allowed: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but no CUDA device is available; use cpu")
    return dev


def lr_at(step: int, cfg: RunConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine decay."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    floor = t.lr * t.min_lr_ratio
    return floor + (t.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def config_hash(cfg: RunConfig) -> str:
    """Identity of what a checkpoint was trained with (where it lives and runs does not count)."""
    d = cfg.to_dict()
    for k in ("checkpoint_dir", "device"):
        d.pop(k)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


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


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _autocast(cfg: RunConfig, device: torch.device) -> AbstractContextManager[Any]:
    p = cfg.train.precision
    use_bf16 = p == "bf16" or (
        p == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if use_bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], ctx_fn: Any
) -> float:
    """Mean validation loss over the fixed held-out batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:  # the last batch may be smaller: weight by tokens
        with ctx_fn():
            total += float(model(x, y)) * y.numel()
        count += y.numel()
    model.train(was_training)
    return total / count


def _save(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: a reader sees the old or the new checkpoint, never half of one
    # a small sidecar that says what the checkpoint holds without loading it (runner, `ablate plan`)
    st = obj["state"]
    info = {"step": st["step"], "status": st["status"], "config_hash": obj["config_hash"]}
    side = path.with_suffix(".json")
    side.with_suffix(".json.tmp").write_text(json.dumps(info))
    os.replace(side.with_suffix(".json.tmp"), side)


def checkpoint_info(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """{"step", "status", "config_hash"} of the checkpoint in ``checkpoint_dir``, or None."""
    try:
        info: dict[str, Any] = json.loads((Path(checkpoint_dir) / "checkpoint.json").read_text())
    except (OSError, ValueError):
        return None
    return info


def train(
    config: RunConfig, logger: Logger | None = None, *, stop_after: int | None = None
) -> RunResult:
    """Train one configuration; ``stop_after`` ends the run (status ``stopped``, checkpointed) once
    that many steps are done, as an interruption would."""
    log: Logger = logger if logger is not None else NullLogger()
    t_start = time.perf_counter()
    tc = config.train
    device = resolve_device(config.device)
    data = load_data(config.data)
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after: must be >= 0, got {stop_after}")
    ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    if (tc.checkpoint_every or stop_after is not None) and ckpt_dir is None:
        raise ValueError("checkpoint_dir: needed for train.checkpoint_every and stop_after")

    model = build_model(
        config.model,
        data.vocab_size,
        recipe=config.recipe,
        backend=config.backend,
        seed=config.seed,
        device=device,
    )
    n_params = count_parameters(model)
    opt = torch.optim.AdamW(
        _param_groups(model, tc.weight_decay),
        lr=tc.lr,
        betas=(tc.beta1, tc.beta2),
        eps=tc.eps,
    )
    sampler = BatchSampler(data.train, tc.seq_len, tc.batch_size, config.data.data_seed)
    val = val_batches(data.val, tc.seq_len, tc.batch_size)
    if tc.eval_batches:
        val = val[: tc.eval_batches]
    if not val:
        raise ValueError(
            f"data.val_tokens: {data.val.numel()} held-out tokens make no validation batch of "
            f"{tc.batch_size} x {tc.seq_len}; raise data.val_tokens or lower the batch"
        )
    val = [(x.to(device), y.to(device)) for x, y in val]

    def ctx() -> AbstractContextManager[Any]:
        return _autocast(config, device)

    chash = config_hash(config)
    st: dict[str, Any] = {
        "step": 0,
        "tokens": 0,
        "train_time": 0.0,
        "evals": [],
        "ema": None,
        "best_ema": math.inf,
        "status": None,
        "reason": "",
        "diverged_at": None,
    }

    def result() -> RunResult:
        return RunResult(
            status=st["status"] or "stopped",
            steps=st["step"],
            tokens=st["tokens"],
            evals=[EvalPoint(**e) for e in st["evals"]],
            tokens_per_s=st["tokens"] / st["train_time"] if st["train_time"] else 0.0,
            fingerprint=data.fingerprint,
            diverged_at=st["diverged_at"],
            reason=st["reason"],
            wall_time_s=time.perf_counter() - t_start,
            n_params=n_params,
        )

    def save() -> None:
        if ckpt_dir is None:
            return
        # the steps up to this checkpoint are stored before it exists: a resumed run re-reports
        # only later steps (a kill after the flush and before the write re-reports logged steps,
        # which the logger drops)
        log.flush()
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        obj = {
            "config_hash": chash,
            "state": st,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "sampler": sampler.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        _save(ckpt_dir / CHECKPOINT, obj)

    path = ckpt_dir / CHECKPOINT if ckpt_dir else None
    if path is not None and path.exists():
        ck = torch.load(path, map_location=device, weights_only=False)
        if ck["config_hash"] != chash:
            raise ValueError(
                f"checkpoint_dir: {path} was written by a different configuration "
                f"({ck['config_hash']} != {chash}); use a new checkpoint_dir for a new config"
            )
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sampler.load_state_dict(ck["sampler"])
        torch.set_rng_state(ck["rng_cpu"])
        if ck["rng_cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["rng_cuda"])
        st.update(ck["state"])
        if st["status"] in ("finished", "diverged"):
            return result()  # already done: nothing to train, nothing to log again
        st["status"] = None

    params = flatten(config.to_dict())
    params.update({"data.fingerprint": data.fingerprint, "model.n_params": n_params})
    log.log_params(params)

    def record_eval(metrics: dict[str, float]) -> None:
        loss = evaluate(model, val, ctx)
        st["evals"].append({"step": st["step"], "tokens": st["tokens"], "val_loss": loss})
        metrics.update(val_loss=loss, val_ppl=math.exp(min(loss, 700.0)))

    if st["step"] == 0 and not st["evals"]:
        m0: dict[str, float] = {"tokens": 0.0}
        record_eval(m0)
        log.log_metrics(m0, 0)

    loss_ceiling = 3.0 * math.log(data.vocab_size)  # far worse than a uniform prediction
    model.train()
    while st["step"] < tc.steps:
        if stop_after is not None and st["step"] >= stop_after:
            save()
            log.log_status("stopped", {"step": st["step"]})
            return result()
        t0 = time.perf_counter()
        lr = lr_at(st["step"], config)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        x, y = sampler.next()
        x, y = x.to(device), y.to(device)
        loss_val = 0.0
        for xm, ym in zip(x.chunk(tc.grad_accum), y.chunk(tc.grad_accum), strict=True):
            with ctx():
                loss = model(xm, ym)
            (loss / tc.grad_accum).backward()
            loss_val += float(loss.detach()) / tc.grad_accum
        clip = tc.grad_clip if tc.grad_clip > 0 else math.inf
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), clip))
        finite = math.isfinite(loss_val) and math.isfinite(grad_norm)
        if finite:
            opt.step()
        st["step"] += 1
        st["tokens"] += tc.tokens_per_step
        st["train_time"] += time.perf_counter() - t0
        metrics: dict[str, float] = {
            "train_loss": loss_val,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": float(st["tokens"]),
            "tokens_per_s": st["tokens"] / st["train_time"],
        }
        # divergence guard
        reason = ""
        if not finite:
            reason = f"non-finite loss ({loss_val}) or gradient norm ({grad_norm})"
        else:
            st["ema"] = loss_val if st["ema"] is None else 0.9 * st["ema"] + 0.1 * loss_val
            if st["step"] > tc.warmup_steps:
                st["best_ema"] = min(st["best_ema"], st["ema"])
            if loss_val > loss_ceiling:
                reason = f"loss {loss_val:.3g} exceeds 3 ln(vocab) = {loss_ceiling:.3g}"
            elif st["ema"] > tc.divergence_factor * st["best_ema"]:
                reason = (
                    f"smoothed loss {st['ema']:.3g} exceeds {tc.divergence_factor} x its best "
                    f"{st['best_ema']:.3g}"
                )
        if reason:
            log.log_metrics(metrics, st["step"])
            st.update(status="diverged", reason=reason, diverged_at=st["step"])
            save()
            log.log_status("diverged", {"step": st["step"], "reason": reason})
            return result()
        if st["step"] % tc.eval_every == 0 or st["step"] == tc.steps:
            record_eval(metrics)
        log.log_metrics(metrics, st["step"])
        if st["step"] == tc.steps:
            st["status"] = "finished"
            save()
        elif tc.checkpoint_every and st["step"] % tc.checkpoint_every == 0:
            save()
    st["status"] = "finished"
    res = result()
    log.log_status(
        "finished",
        {"step": st["step"], "val_loss": res.final_val_loss, "tokens_per_s": res.tokens_per_s},
    )
    return res
