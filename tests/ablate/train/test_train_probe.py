"""Probes in the trainer: a run is bit-identical with probes on or off, the metrics appear at the
probe steps with their names (mean and per block), the settings select layers and GEMMs, bad
settings name their path, and the post-hoc probe of a checkpoint gives the in-training numbers."""

from __future__ import annotations

import math
import re

import pytest
import torch

from ablate.data import DataConfig
from ablate.model import ModelConfig
from ablate.train import MemoryLogger, RunConfig, TrainConfig, train
from ablate.train.checkpoint import CHECKPOINT
from ablate.train.config import ProbeConfig, probe_problems
from ablate.train.probe import aggregate, block_of, probe_checkpoints
from backends import Recipe
from backends.recipes import GEMMS

FAST = TrainConfig(
    steps=4, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=2, eval_every=2, eval_batches=1
)
TWO_BLOCKS = ModelConfig(preset="tiny", n_layers=2)
SR_RHT = Recipe.from_shorthand(GEMMS, "sr+rht", base="fp8")


def _cfg(tmp_path=None, **kw) -> RunConfig:
    base = {
        "train": FAST,
        "model": TWO_BLOCKS,
        "data": DataConfig(val_tokens=4096),
        "recipe": SR_RHT,
        "device": "cpu",
    }
    if tmp_path is not None:
        base["checkpoint_dir"] = str(tmp_path / "ckpt")
    base.update(kw)
    return RunConfig(**base)


def _probe_metrics(log: MemoryLogger) -> dict[int, dict[str, float]]:
    return {
        s: {k: v for k, v in m.items() if k.startswith("probe.")}
        for s, m in log.metrics
        if any(k.startswith("probe.") for k in m)
    }


@pytest.mark.parametrize("grad_accum", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_run_is_bit_identical_with_probes_on_or_off(tmp_path, grad_accum):
    """Probes with random redraws on every GEMM of a random recipe: the weights, the optimizer, the
    layers' stream counters, the losses and the evaluations end exactly as without probes."""
    train_cfg = TrainConfig(
        steps=4,
        batch_size=8,
        seq_len=64,
        lr=3e-3,
        warmup_steps=2,
        eval_every=2,
        eval_batches=1,
        grad_accum=grad_accum,
    )
    off, on = MemoryLogger(), MemoryLogger()
    probe = ProbeConfig(every=2, gemms=list(GEMMS), repeats=2, window=2)
    torch.manual_seed(123)  # the global RNG (which the loop also draws from) starts alike
    r_off = train(_cfg(tmp_path / "off", train=train_cfg), off)
    torch.manual_seed(123)
    r_on = train(_cfg(tmp_path / "on", train=train_cfg, probe=probe), on)
    assert [e.val_loss for e in r_off.evals] == [e.val_loss for e in r_on.evals]
    assert off.series("train_loss") == on.series("train_loss")
    assert off.series("grad_norm") == on.series("grad_norm")
    a = torch.load(tmp_path / "off" / "ckpt" / CHECKPOINT, weights_only=False)
    b = torch.load(tmp_path / "on" / "ckpt" / CHECKPOINT, weights_only=False)
    assert a["config_hash"] == b["config_hash"]  # probes are not part of the key
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, v in a["optimizer"]["state"].items():
        for name, t in v.items():
            assert torch.equal(t, b["optimizer"]["state"][k][name]), (k, name)
    assert torch.equal(a["rng_cpu"], b["rng_cpu"])  # the probes drew nothing from it
    assert sorted(_probe_metrics(on)) == [0, 2, 4]
    assert not _probe_metrics(off)


def test_probe_metrics_are_named_per_gemm_metric_and_block():
    log = MemoryLogger()
    probe = ProbeConfig(every=1, gemms=["fprop", "wgrad"], repeats=2, window=3)
    train(_cfg(probe=probe), log)
    steps = _probe_metrics(log)
    assert sorted(steps) == [0, 1, 2, 3, 4]
    m0, m1, m2 = steps[0], steps[1], steps[2]
    for gemm in ("fprop", "wgrad"):
        for metric in ("cos", "align", "rel_err", "sqnr_db", "bias", "noise", "bias_ratio"):
            assert f"probe.{gemm}.{metric}" in m0
            assert [f"probe.{gemm}.{metric}.L{i}" in m0 for i in range(2)] == [True] * 2
        assert 0.9 < m0[f"probe.{gemm}.cos"] <= 1.0 and 0 < m0[f"probe.{gemm}.rel_err"] < 0.5
    assert not any(k.startswith("probe.dgrad") for k in m0)
    for op in ("x", "w"):
        assert 0 <= m0[f"probe.fprop.{op}.sat"] < 1 and m0[f"probe.fprop.{op}.util"] > 0
    for op in ("dy", "x"):
        assert f"probe.wgrad.{op}.ftz" in m0 and f"probe.wgrad.{op}.ftz.L1" in m0
    # error structure: a previous probe is needed for step_cos, `window` of them for sum_ratio
    assert "probe.wgrad.step_cos" not in m0 and "probe.wgrad.step_cos" in m1
    assert "probe.wgrad.step_cos_perp" in m1 and "probe.fprop.step_cos_perp.L0" in m1
    assert "probe.wgrad.sum_ratio" not in m1 and "probe.wgrad.sum_ratio" in m2
    assert abs(m1["probe.wgrad.step_cos"]) < 0.5  # SR + random Hadamard: redrawn every step
    assert m0["probe.seconds"] > 0 and "probe.cost" not in m0 and m1["probe.cost"] > 0
    # the mean over layers is the mean of the per-block means (every block has 7 linears)
    blocks = [m0[f"probe.wgrad.rel_err.L{i}"] for i in range(2)]
    assert m0["probe.wgrad.rel_err"] == pytest.approx(sum(blocks) / 2)


def test_deterministic_recipe_errs_alike_across_draws_and_keeps_its_pattern_across_steps():
    """DHT: every draw is the same (bias_ratio 1, noise 0); one step apart on the same batch its
    wgrad error keeps more of its pattern than SR + random Hadamard's, which is redrawn (whose
    consecutive errors are nearly orthogonal)."""
    step_cos = {}
    for name, recipe in (("dht", Recipe.from_shorthand(GEMMS, "dht", base="fp8")), ("rnd", SR_RHT)):
        log = MemoryLogger()
        train(_cfg(recipe=recipe, probe=ProbeConfig(every=1, repeats=2, window=2)), log)
        m = _probe_metrics(log)
        step_cos[name] = [m[s]["probe.wgrad.step_cos"] for s in range(1, 5)]
        if name == "dht":
            assert m[4]["probe.wgrad.bias_ratio"] == 1.0 and m[4]["probe.wgrad.draw_cos"] == 1.0
            assert m[4]["probe.wgrad.noise"] == 0.0
        else:
            assert m[4]["probe.wgrad.bias_ratio"] < 0.95 and m[4]["probe.wgrad.noise"] > 0
    # (at steps 1-4 the pattern is still weak: the early steps change the gradients most)
    mean = {k: sum(v) / len(v) for k, v in step_cos.items()}
    assert mean["dht"] > mean["rnd"] + 0.05 and max(map(abs, step_cos["rnd"])) < 0.05, step_cos


def test_layers_and_gemms_select_what_is_probed_and_high_precision_is_skipped():
    log = MemoryLogger()
    train(
        _cfg(
            model=ModelConfig(preset="tiny"),
            probe=ProbeConfig(every=3, layers=[1, 3], gemms=["dgrad"]),
        ),
        log,
    )
    m = _probe_metrics(log)[0]
    assert {k.rsplit(".", 1)[-1] for k in m if ".L" in k} == {"L1", "L3"}
    assert {k.split(".")[1] for k in m if k != "probe.seconds"} == {"dgrad"}
    # keep_first exempts block 0: nothing of it is probed; bf16 has nothing to probe at all
    keep = Recipe.from_shorthand(["wgrad"], "none", keep_first=1)
    log = MemoryLogger()
    train(_cfg(recipe=keep, probe=ProbeConfig(every=3)), log)
    assert not any(k.endswith(".L0") for k in _probe_metrics(log)[0])
    log = MemoryLogger()
    train(_cfg(recipe=Recipe.bf16(), probe=ProbeConfig(every=3)), log)
    assert not _probe_metrics(log)


def test_bad_probe_settings_name_their_path():
    for kw, msg in [
        ({"every": 0}, "probe.every: must be >= 1"),
        ({"window": 1}, "probe.window: must be >= 2"),
        ({"repeats": 0}, "probe.repeats: must be >= 1"),
        ({"gemms": []}, "probe.gemms: empty; allowed: fprop, dgrad, wgrad"),
        ({"gemms": ["wgard"]}, "probe.gemms[0]: unknown 'wgard'; allowed: fprop, dgrad, wgrad"),
        ({"gemms": ["wgrad", "wgrad"]}, "probe.gemms: a GEMM is listed twice"),
        ({"layers": "some"}, "probe.layers: unknown 'some'; allowed: all or a list"),
        ({"layers": [0, -1]}, "probe.layers[1]: -1 is not a block index"),
        ({"layers": []}, "probe.layers: empty"),
    ]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            ProbeConfig(**kw)
    cfg = _cfg(probe=ProbeConfig(layers=[1, 2], batches=7))
    assert cfg.probe is not None
    assert probe_problems(cfg.probe, cfg) == [
        "probe.layers[1]: block 2 does not exist; the model has 2 blocks (0-1)"
    ]
    cfg = _cfg(probe=ProbeConfig(batches=8))
    assert cfg.probe is not None
    (msg,) = probe_problems(cfg.probe, cfg)
    assert msg.startswith("probe.batches: 8 probe batches") and "data.val_tokens >= 4097" in msg
    with pytest.raises(ValueError, match="probe.batches: 8 probe batches"):
        train(cfg)


def test_probe_config_round_trips_and_stays_out_of_key_and_params():
    from ablate.train.config import config_hash, run_params

    cfg = _cfg(probe=ProbeConfig(every=5, layers=[0], gemms=["wgrad", "fprop"]))
    d = cfg.to_dict()
    assert d["probe"]["layers"] == [0] and d["probe"]["gemms"] == ["wgrad", "fprop"]
    assert RunConfig.from_dict(d).probe == cfg.probe
    assert config_hash(cfg) == config_hash(_cfg())
    assert not any(k.startswith("probe") for k in run_params(cfg))
    assert "probe" not in _cfg().to_dict()  # an unprobed run's dict is what it always was


def test_post_hoc_probe_of_a_checkpoint_gives_the_in_training_numbers(tmp_path):
    probe = ProbeConfig(every=2, gemms=list(GEMMS), repeats=2)
    log = MemoryLogger()
    cfg = _cfg(tmp_path, probe=probe)
    train(cfg, log)
    during = _probe_metrics(log)[4]
    ((step, after),) = probe_checkpoints(cfg, [tmp_path / "ckpt"])
    assert step == 4
    skip = ("probe.seconds", "probe.cost")
    history = (".step_cos", ".sum_ratio")
    want = {k: v for k, v in during.items() if k not in skip and not any(h in k for h in history)}
    got = {k: v for k, v in after.items() if k not in skip}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == v or (math.isnan(v) and math.isnan(got[k])), k
    other = _cfg(tmp_path, probe=probe, seed=1)
    with pytest.raises(ValueError, match="written by another configuration"):
        probe_checkpoints(other, [tmp_path / "ckpt"])
    with pytest.raises(ValueError, match="does not exist"):
        probe_checkpoints(cfg, [tmp_path / "nothing"])


def test_block_index_and_aggregation():
    assert block_of("layers.3.attention.wq") == 3 and block_of("head") is None
    m = aggregate(
        {
            "layers.0.a": {"wgrad.cos": 1.0},
            "layers.0.b": {"wgrad.cos": 0.5},
            "layers.1.a": {"wgrad.cos": math.nan},
            "proj": {"wgrad.cos": 0.0},
        }
    )
    assert m["probe.wgrad.cos.L0"] == 0.75 and math.isnan(m["probe.wgrad.cos.L1"])
    assert m["probe.wgrad.cos"] == 0.5  # NaN left out of the mean; layers without a block count
