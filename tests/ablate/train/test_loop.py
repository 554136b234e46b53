"""The training loop: it learns, resumes bit-exactly, reports every step once, ends diverged runs
as ``diverged``, and refuses bad configuration before training."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

from ablate.data import DataConfig, load_data
from ablate.model import ModelConfig, build_model
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.checkpoint import CHECKPOINT
from ablate.train.schedule import lr_at
from backends import QuantLinear, Recipe, convert_model

FAST = TrainConfig(
    steps=12, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=3, eval_every=4, eval_batches=2
)


def _cfg(tmp_path=None, **kw) -> RunConfig:
    base = {"train": FAST, "data": DataConfig(val_tokens=4096)}
    if tmp_path is not None:
        base["checkpoint_dir"] = str(tmp_path / "ckpt")
    base.update(kw)
    return RunConfig(**base)


def _weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path / "ckpt" / CHECKPOINT, weights_only=False)["model"]


def test_tiny_preset_learns_more_than_byte_frequencies_in_seconds():
    cfg = _cfg(
        train=TrainConfig(
            steps=60,
            batch_size=8,
            seq_len=64,
            lr=1e-2,
            warmup_steps=5,
            eval_every=15,
            eval_batches=4,
        )
    )
    res = train(cfg)
    assert res.status == "finished" and res.steps == 60 and res.tokens == 60 * 8 * 64
    assert [e.step for e in res.evals] == [0, 15, 30, 45, 60]
    first, last = res.evals[0].val_loss, res.evals[-1].val_loss
    assert first == pytest.approx(math.log(257), abs=0.3)  # uniform over the byte vocab at init
    # the bar: a unigram model of the training bytes (add-one smoothed), scored on the validation
    # bytes, about 3.44 nats on the built-in corpus; the model must use context to get below it
    data = load_data(cfg.data)
    counts = torch.bincount(data.train.long(), minlength=data.vocab_size).double() + 1
    unigram = float(-(counts / counts.sum()).log()[data.val.long()].mean())
    assert last < unigram - 0.1, (last, unigram)
    assert res.tokens_per_s > 0 and res.fingerprint


def test_resume_is_bit_exact_and_reports_every_step_once(tmp_path):
    whole = MemoryLogger()
    res_a = train(_cfg(tmp_path / "a", recipe=Recipe.from_shorthand(["wgrad"], "sr+rht")), whole)
    cfg_b = _cfg(tmp_path / "b", recipe=Recipe.from_shorthand(["wgrad"], "sr+rht"))
    parts = MemoryLogger()
    stopped = train(cfg_b, parts, stop_after=5)
    assert stopped.status == "stopped" and stopped.steps == 5
    res_b = train(cfg_b, parts)
    assert res_b.status == "finished"
    steps = [s for s, m in parts.metrics if "val_ppl_by_tokens" not in m]
    assert steps == list(range(0, 13))  # step 0 (initial eval) then 1..12, each exactly once
    # each evaluation after step 0 once more with the tokens seen as its step (the UI's x-axis)
    by_tokens = [s for s, m in parts.metrics if "val_ppl_by_tokens" in m]
    assert by_tokens == [int(e.tokens) for e in res_b.evals if e.step > 0]
    assert "init_val_ppl" in parts.metrics[0][1] and "val_ppl" not in parts.metrics[0][1]
    assert parts.series("train_loss") == whole.series("train_loss")
    assert parts.series("val_loss") == whole.series("val_loss")
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert [e.val_loss for e in res_a.evals] == [e.val_loss for e in res_b.evals]


def test_a_run_past_its_schedule_is_bit_identical_to_an_ordinary_run_up_to_it(tmp_path):
    # a baseline that trains on (a study's baseline_extend): the ordinary run has 10 steps (its
    # last evaluation at 10, not a multiple of eval_every); the longer one 15 with the same
    # schedule over its first 10. Stochastic rounding and a random Hadamard draw random streams.
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "sr+rht")
    small = dataclasses.replace(FAST, batch_size=4, seq_len=32)  # four runs: the bits, not the loss
    short = dataclasses.replace(small, steps=10)
    longer = dataclasses.replace(small, steps=15, schedule_steps=10)
    ordinary_log, longer_log = MemoryLogger(), MemoryLogger()
    ordinary = train(_cfg(tmp_path / "a", recipe=recipe, train=short), ordinary_log)
    cfg = _cfg(tmp_path / "b", recipe=recipe, train=longer)
    at_budget = train(cfg, longer_log, stop_after=10)  # checkpointed at step 10
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in wa:  # the weights at the budget: the same bits
        assert torch.equal(wa[k], wb[k]), k
    assert at_budget.evals == ordinary.evals  # steps 0, 4, 8, 10: the same losses, bit for bit
    res = train(cfg, longer_log)  # resumed past the budget
    assert [e.step for e in res.evals] == [0, 4, 8, 10, 12, 15]
    assert res.evals[:4] == ordinary.evals
    assert longer_log.series("train_loss")[:10] == ordinary_log.series("train_loss")
    lrs = [lr for _, lr in longer_log.series("lr")]
    assert lrs[:10] == [lr for _, lr in ordinary_log.series("lr")]
    assert lrs[10:] == [FAST.lr * FAST.min_lr_ratio] * 5  # on at the schedule's final rate
    # and the resumed run is the uninterrupted one
    whole = train(_cfg(tmp_path / "c", recipe=recipe, train=longer))
    assert whole.evals == res.evals
    wb, wc = _weights(tmp_path / "b"), _weights(tmp_path / "c")
    for k in wb:
        assert torch.equal(wb[k], wc[k]), k


def test_a_wsd_run_past_its_schedule_is_an_ordinary_wsd_run_up_to_it():
    # baseline_extend on a wsd study: the decay of the 10-step schedule (steps 8-9), then on at
    # the floor; the first 10 steps are the 10-step run's, bit for bit (SR draws random streams)
    recipe = Recipe.from_shorthand(["wgrad"], "sr")
    short = dataclasses.replace(FAST, steps=10, schedule="wsd")
    longer = dataclasses.replace(short, steps=14, schedule_steps=10)
    ordinary_log, longer_log = MemoryLogger(), MemoryLogger()
    ordinary = train(_cfg(recipe=recipe, train=short), ordinary_log)
    res = train(_cfg(recipe=recipe, train=longer), longer_log)
    assert [e.step for e in res.evals] == [0, 4, 8, 10, 12, 14]
    assert res.evals[:4] == ordinary.evals
    assert longer_log.series("train_loss")[:10] == ordinary_log.series("train_loss")
    lrs = [lr for _, lr in longer_log.series("lr")]
    assert lrs[:10] == [lr for _, lr in ordinary_log.series("lr")]
    assert longer_log.params["train.schedule"] == "wsd"
    assert longer_log.params["model.n_params_non_embedding"] == 787_584  # N of tiny (test_model)
    floor = FAST.lr * FAST.min_lr_ratio  # the peak until step 8, halfway, then the floor
    assert lrs[7:] == pytest.approx([FAST.lr, (FAST.lr + floor) / 2] + [floor] * 5)


def test_a_finished_run_is_not_trained_again(tmp_path):
    cfg = _cfg(tmp_path)
    first = train(cfg)
    again = MemoryLogger()
    second = train(cfg, again)
    assert second.status == "finished" and second.steps == first.steps
    assert again.metrics == [] and second.final_val_loss == first.final_val_loss


def test_checkpoint_of_another_config_is_refused(tmp_path):
    train(_cfg(tmp_path), stop_after=2)
    other = _cfg(tmp_path, seed=1)
    with pytest.raises(ValueError, match="checkpoint_dir: .* different configuration"):
        train(other)


def test_mxfp4_changes_the_numbers():
    bf16 = train(_cfg())
    fp4 = train(_cfg(recipe=Recipe.from_shorthand(["fprop", "dgrad", "wgrad"])))
    assert fp4.status == "finished"
    assert fp4.final_val_loss != bf16.final_val_loss
    assert abs(fp4.final_val_loss - bf16.final_val_loss) < 0.5  # different, not broken


def test_bf16_through_quantized_layers_trains_exactly_like_nn_linear():
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny")
    plain = build_model(cfg, 257, seed=3)
    conv = build_model(cfg, 257, seed=3)
    convert_model(conv, Recipe.bf16())
    assert sum(isinstance(m, QuantLinear) for m in conv.modules()) == 7 * 4
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (plain, conv)]
    x = torch.randint(0, 257, (4, 33))
    for _ in range(3):
        for m, o in zip((plain, conv), opts, strict=True):
            o.zero_grad()
            m(x[:, :-1], x[:, 1:]).backward()
            o.step()
    conv_state = conv.state_dict()
    for n, a in plain.state_dict().items():
        assert torch.equal(a, conv_state[n]), n


def test_huge_learning_rate_ends_as_diverged_with_the_step():
    log = MemoryLogger()
    cfg = _cfg(
        train=TrainConfig(
            steps=40,
            batch_size=8,
            seq_len=64,
            lr=50.0,
            warmup_steps=0,
            eval_every=40,
            eval_batches=1,
            grad_clip=0.0,
        )
    )
    res = train(cfg, log)
    assert res.status == "diverged"
    assert res.diverged_at is not None and 1 <= res.diverged_at < 40
    assert res.reason
    assert log.status is not None and log.status[0] == "diverged"
    assert log.metrics[-1][0] == res.diverged_at


def test_reading_every_n_steps_changes_no_number_and_logs_every_step_once(tmp_path):
    """``log_every`` defers the host reads of loss and gradient norm (a GPU queues steps without
    waiting): the run computes the same bits and logs the same metrics, each step once."""
    recipe = Recipe.from_shorthand(["wgrad"], "sr+rht")
    every, each = MemoryLogger(), MemoryLogger()
    deferred = dataclasses.replace(FAST, log_every=5)
    a = train(_cfg(tmp_path / "a", recipe=recipe), each)
    b = train(_cfg(tmp_path / "b", recipe=recipe, train=deferred), every)
    assert [e.val_loss for e in a.evals] == [e.val_loss for e in b.evals]
    steps = [s for s, m in every.metrics if "val_ppl_by_tokens" not in m]
    assert steps == list(range(13))
    for name in ("train_loss", "grad_norm", "lr", "tokens", "val_loss"):
        assert every.series(name) == each.series(name), name
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_a_deferred_divergence_is_dated_to_its_own_step():
    log, logn = MemoryLogger(), MemoryLogger()
    fields = {
        "steps": 40, "batch_size": 8, "seq_len": 64, "lr": 50.0, "warmup_steps": 0,
        "eval_every": 40, "eval_batches": 1, "grad_clip": 0.0,
    }  # fmt: skip
    each = train(_cfg(train=TrainConfig(**fields)), log)
    late = train(_cfg(train=TrainConfig(**fields, log_every=16)), logn)
    assert each.status == late.status == "diverged"
    assert late.diverged_at == each.diverged_at and late.reason == each.reason
    assert logn.metrics[-1][0] == late.diverged_at
    assert late.steps >= late.diverged_at  # it trained on to the read, and no further


def test_the_matmul_policy_is_explicit():
    from ablate.train.device import numerics_policy

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    try:
        train(_cfg(train=TrainConfig(steps=1, batch_size=2, seq_len=32, eval_every=1)))
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction is False
    finally:
        numerics_policy()


@pytest.mark.slow
def test_a_compiled_run_trains_checkpoints_alike_and_matches_eager_closely(tmp_path, monkeypatch):
    """``train.compile: true`` (CUDA's ``auto``): the model, quantizers included, runs compiled
    (traced by Dynamo and AOTAutograd; ``aot_eager`` generates no code, which Inductor's C++
    backend takes many minutes for on this CPU); the run finishes, its checkpoint has the eager
    run's names (compiled in place), and it tracks the eager run within rounding (decomposed
    backward kernels)."""
    monkeypatch.setenv("ABLATE_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "sr")
    # two full evaluation batches (a short last one recompiles the blocks with a symbolic batch)
    tc = TrainConfig(
        steps=3, batch_size=4, seq_len=32, warmup_steps=1, eval_every=3, eval_batches=2
    )
    compiled = train(
        _cfg(tmp_path / "c", recipe=recipe, train=dataclasses.replace(tc, compile=True))
    )
    eager = train(_cfg(tmp_path / "e", recipe=recipe, train=tc))
    assert compiled.status == "finished"
    assert _weights(tmp_path / "c").keys() == _weights(tmp_path / "e").keys()
    for c, e in zip(compiled.evals, eager.evals, strict=True):
        assert c.val_loss == pytest.approx(e.val_loss, abs=0.05)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    cfg = _cfg(train=TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1))
    assert lr_at(0, cfg.train) == pytest.approx(0.1)
    assert lr_at(9, cfg.train) == pytest.approx(1.0)
    assert lr_at(100, cfg.train) == pytest.approx(0.1)
    assert lr_at(55, cfg.train) == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ModelConfig(preset="gigantic"), "model.preset"),
        (lambda: ModelConfig(preset="tiny", dim=130), "model"),
        (lambda: ModelConfig(preset="tiny", n_heads=4, n_kv_heads=3), "model.n_kv_heads"),
        (lambda: TrainConfig(batch_size=10, grad_accum=3), "train.grad_accum"),
        (lambda: RunConfig(train=TrainConfig(seq_len=4096)), "train.seq_len"),
        (lambda: TrainConfig(precision="fp16"), "train.precision"),
        (lambda: TrainConfig(compile="yes"), "train.compile: unknown 'yes'; allowed: auto, true"),
        (lambda: TrainConfig(log_every=0), "train.log_every: must be >= 1"),
        (lambda: RunConfig(seed=-1), "seed"),
    ],
)
def test_bad_config_is_refused_naming_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_missing_data_file_is_refused_before_training(tmp_path):
    cfg = _cfg(data=DataConfig(corpus="text", path=str(tmp_path / "nope.txt")))
    with pytest.raises(FileNotFoundError, match="data.path"):
        train(cfg)


def test_gradient_accumulation_matches_the_full_batch():
    full = train(_cfg())
    acc = train(_cfg(train=TrainConfig(**{**_fields(FAST), "grad_accum": 4})))
    assert acc.final_val_loss == pytest.approx(full.final_val_loss, rel=1e-3)


def _fields(t: TrainConfig) -> dict:
    return {f: getattr(t, f) for f in t.__slots__}


def test_evaluation_runs_in_training_micro_batches_and_weighs_them_by_tokens():
    # grad_accum 4 of a batch of 8: training's forwards take 2 sequences, and so do evaluation's
    # (a whole batch of 8 at once would hold four times the log-probabilities); the loss is the
    # same token-weighted mean, also over a short last batch
    from ablate.train.loop import evaluate

    model = build_model(ModelConfig(preset="tiny"), 257, seed=0)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    data = load_data(DataConfig(val_tokens=4096))
    from ablate.data import val_batches

    batches = val_batches(data.val, 64, 8)
    assert batches[-1][0].shape[0] < 8  # a short last batch
    whole = evaluate(model, batches, contextlib.nullcontext)
    assert set(rows) == {8, batches[-1][0].shape[0]}
    rows.clear()
    micro = evaluate(model, batches, contextlib.nullcontext, micro_batch=2)
    assert max(rows) == 2 and sum(rows) == sum(x.shape[0] for x, _ in batches)
    assert micro == pytest.approx(whole, rel=1e-6)


@pytest.mark.parametrize(
    ("graph", "inline"), [("inline", True), ("opaque", False), ("auto", False)]
)
def test_the_trainer_compiles_the_quantizer_as_the_config_says(graph, inline, monkeypatch):
    # what Dynamo reads as it traces the blocks (backends.quant.ops): set before they compile
    from ablate.train.logger import NullLogger
    from ablate.train.loop import build_run
    from backends.quant import ops

    monkeypatch.setenv("ABLATE_QUANT_OPS", "1" if inline else "0")  # the config wins over it
    cfg = RunConfig(
        model=ModelConfig(preset="tiny"),
        data=DataConfig(val_tokens=1024),
        train=TrainConfig(steps=1, batch_size=2, seq_len=32, compile=True),
        recipe=Recipe.from_shorthand(["fprop"]),
        quantizer_graph=graph,
        device="cpu",
    )
    build_run(cfg, NullLogger(), None)
    assert ops.traced_inline() is inline  # (the suite's conftest forgets it after each test)
