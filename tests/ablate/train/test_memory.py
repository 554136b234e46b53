"""The memory estimate (``ablate.train.memory``) against the real model on the CPU."""

import contextlib
import os
import tempfile
from collections.abc import Iterator

import pytest
import torch

from ablate.model import ModelConfig, build_model, count_parameters, num_params
from ablate.train.memory import (
    activation_parts,
    estimate,
    estimate_run,
    format_bytes,
    fsdp_unsharded,
    param_count,
    parse_size,
)
from backends import Recipe


def _config(preset: str) -> ModelConfig:
    """A preset, or ``tiny-head_dim64``: tiny with heads of 64 (``model.head_dim``; 128 / 4 = 32)."""
    return (
        ModelConfig(preset="tiny", head_dim=64)
        if preset.endswith("64")
        else ModelConfig(preset=preset)
    )


@pytest.mark.parametrize("preset", ["tiny", "small", "tiny-head_dim64"])
def test_param_count_is_exact(preset):
    cfg = _config(preset)
    assert param_count(cfg, 257) == count_parameters(build_model(cfg, 257))


def test_param_count_of_the_large_presets_without_building():
    # the documented Llama 3.1-8B figure; 125m and 1b against the meta-device count
    assert param_count(ModelConfig(preset="llama3_8b")) == 8_030_261_248
    for preset in ("125m", "1b"):
        assert param_count(ModelConfig(preset=preset)) == num_params(ModelConfig(preset=preset))


def _saved_bytes(model, tokens, precision):
    """Bytes of the distinct storages autograd saves in one forward with the loss, parameters
    excluded (they are counted as parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x):
        s = x.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return x

    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), ctx:
        model(tokens, tokens)
    return sum(seen.values())


@pytest.mark.parametrize(
    ("preset", "fp4"),
    [("tiny", False), ("small", False), ("tiny", True), ("tiny-head_dim64", False)],
    ids=str,
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_estimate_matches_the_saved_tensors(preset, fp4, precision):
    """Within 2%: the estimate lists the tensors autograd saves one by one, so it should agree
    to the byte but for the RoPE tables (buffers, tens of KB) and QuantLinear's per-call key
    tables (bytes); bf16 is CPU autocast, whose cast rules for linear and SDPA are those of CUDA
    autocast. With every GEMM in MXFP4, QuantLinear saves what nn.Linear does.
    ``tiny-head_dim64``: heads twice as wide as width / heads (``model.head_dim``)."""
    cfg = _config(preset)
    b, t = 4, 128
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "none") if fp4 else None
    model = build_model(cfg, 257, recipe=recipe)
    tokens = torch.randint(0, 257, (b, t), generator=torch.Generator().manual_seed(0))
    measured = _saved_bytes(model, tokens, precision)
    parts = activation_parts(cfg.resolved(257), b, t, precision)
    parts.pop("loss_transient")  # alive around the loss, not saved
    est = estimate(
        cfg, 257, batch_size=b, grad_accum=1, seq_len=t, precision=precision, recipe=recipe
    )
    predicted = sum(parts.values()) + est.weight_copies  # bf16 weight copies are saved too
    assert predicted == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize(
    ("preset", "fp4"), [("tiny", False), ("small", False), ("small", True)], ids=str
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_checkpointed_estimate_matches_the_saved_tensors(preset, fp4, precision):
    """With every block checkpointed (``ablate.model.recompute``) the forward keeps each block's
    input, the head's tensors and the LM head's bf16 copy, within 5% of the estimate; the rebuilt
    block the estimate adds (``recompute``, one block's weight copies) is the per-block figure the
    test above checks without checkpointing, and the saving against it is most of the total."""
    from ablate.model import set_checkpointing

    cfg = ModelConfig(preset=preset)
    b, t = 4, 128
    recipe = Recipe.from_shorthand(["fprop", "dgrad", "wgrad"], "sr") if fp4 else None
    model = build_model(cfg, 257, recipe=recipe)
    set_checkpointing(model, "blocks")
    tokens = torch.randint(0, 257, (b, t), generator=torch.Generator().manual_seed(0))
    measured = _saved_bytes(model, tokens, precision)
    c = cfg.resolved(257)
    parts = activation_parts(c, b, t, precision, "blocks")
    one_block = parts.pop("recompute")
    parts.pop("loss_transient")
    kw = dict(batch_size=b, grad_accum=1, seq_len=t, precision=precision, recipe=recipe)
    est = estimate(cfg, 257, checkpointing="blocks", **kw)
    plain = estimate(cfg, 257, **kw)
    block_copies = (plain.weight_copies - est.weight_copies) // (c.n_layers - 1)
    predicted = sum(parts.values()) + est.weight_copies - block_copies  # the LM head's copy
    assert predicted == pytest.approx(measured, rel=0.05)
    assert one_block == activation_parts(c, b, t, precision)["blocks"] // c.n_layers
    assert est.activations == sum(activation_parts(c, b, t, precision, "blocks").values())
    assert est.total < plain.total


def test_the_8b_study_fits_80_gib_with_checkpointed_blocks():
    cfg = ModelConfig(preset="llama3_8b", vocab_size=128256)
    kw = dict(batch_size=64, grad_accum=8, seq_len=8192, precision="bf16", workers=8)
    plain = estimate(cfg, None, parallel="fsdp", **kw)
    ac = estimate(cfg, None, parallel="fsdp", checkpointing="blocks", **kw)
    assert plain.total > 110 * 2**30 and ac.total <= 72 * 2**30
    assert plain.activations - ac.activations > 50 * 2**30  # 67 GiB of blocks -> their inputs


def test_estimate_breakdown_and_fsdp_shards():
    cfg = ModelConfig(preset="llama3_8b")
    e = estimate(cfg, None, batch_size=8, grad_accum=8, seq_len=2048, precision="bf16")
    n = 8_030_261_248
    assert (e.parameters, e.gradients, e.optimizer) == (4 * n, 4 * n, 8 * n)
    assert e.micro_batch == 1 and e.total > 128e9 and e.shards == 1
    assert (e.ddp_buckets, e.fsdp_unsharded) == (0, 0)
    assert e.total == sum(v for k, v in e.breakdown().items() if k not in ("total", "evaluation"))
    # FSDP x8, the same global batch: each worker's micro-batch is 64 / 8 / 8 = 1 sequence
    step = dict(batch_size=64, grad_accum=8, seq_len=2048, precision="bf16")
    one = estimate(cfg, None, **step)
    fsdp = estimate(cfg, None, **step, workers=8, parallel="fsdp")
    assert (fsdp.micro_batch, one.micro_batch, fsdp.shards) == (1, 8, 8)
    assert fsdp.activations * 8 == one.activations
    for part in ("parameters", "gradients", "optimizer"):
        assert getattr(fsdp, part) == -(-getattr(one, part) // 8), part
    # the bf16 copies are of the all-gathered weights: every device holds all of them
    assert fsdp.weight_copies == one.weight_copies > 0
    # reduce-scattered every micro-batch: grad_accum 8 keeps no unsharded gradients beyond the
    # working set's
    assert fsdp.ddp_buckets == 0 and 0 < fsdp.fsdp_unsharded < 4 * n / 2
    parts = fsdp.breakdown().items()
    assert fsdp.total == sum(v for k, v in parts if k not in ("total", "evaluation"))
    # what FSDP changes, and nothing else: 7/8 of the sharded state, 7/8 of the activations (a
    # micro-batch of 1, not 8), plus its unsharded working set
    saved = sum(
        getattr(one, p) - getattr(fsdp, p) for p in ("parameters", "gradients", "optimizer")
    )
    assert saved == pytest.approx(7 / 8 * 16 * n, abs=8)
    assert fsdp.subtotal == (
        one.subtotal - saved - (one.activations - fsdp.activations) + fsdp.fsdp_unsharded
    )
    assert fsdp.short().startswith("fsdp x8: ") and "per worker)" in fsdp.short()
    with pytest.raises(ValueError, match="workers"):
        estimate(cfg, None, batch_size=8, grad_accum=8, seq_len=2048, precision="bf16", workers=0)


def _root_and_block(model) -> tuple[int, int]:
    """Parameters of the FSDP root (what no block holds) and of one block, from the built model."""
    block = sum(p.numel() for p in model.layers[0].parameters())
    in_blocks = {id(p) for b in model.layers for p in b.parameters()}
    root = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    return root, block


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_fsdp_unsharded_working_set_counts_the_built_models_root_and_blocks(preset):
    cfg = ModelConfig(preset=preset)
    model = build_model(cfg, 257)
    root, block = _root_and_block(model)
    c = cfg.resolved(257)
    gathered = 4 * (root + 2 * block)  # the root's and two blocks' fp32 parameters
    assert fsdp_unsharded(c, grad_accum=1) == gathered + gathered  # + their gradients
    assert fsdp_unsharded(c, grad_accum=2) == gathered + gathered  # accumulated sharded
    step = dict(batch_size=8, grad_accum=2, seq_len=64, precision="fp32")
    e = estimate(cfg, 257, **step, workers=4, parallel="fsdp")
    assert e.fsdp_unsharded == 2 * gathered and e.micro_batch == 1  # grad_accum 2: no more


@contextlib.contextmanager
def _group_of_one() -> Iterator[None]:
    """A gloo process group of one process (this one), destroyed on exit."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_fsdp_keeps_every_unsharded_gradient_between_micro_batches():
    """The assumption behind ``fsdp_unsharded`` with grad_accum > 1: a backward without gradient
    sync (``set_requires_gradient_sync(False)``, how ``ablate.train.parallel`` accumulates) leaves
    the whole model's unsharded gradients on the device; a synced one frees them. FSDP2 with fp32
    param and reduce dtypes (the trainer's policy), in a gloo group of one on the CPU; reads FSDP2's
    private per-parameter state, so a torch upgrade that renames it fails here, loudly."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = build_model(ModelConfig(preset="tiny"), 257)
    n = count_parameters(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)

    def unsharded_grad_bytes() -> int:
        total = 0
        for mod in [*model.layers, model]:
            for p in mod._get_fsdp_state()._fsdp_param_group.fsdp_params:
                g = p._unsharded_param.grad
                total += 0 if g is None else g.numel() * g.element_size()
        return total

    with _group_of_one():
        for block in model.layers:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        x = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
        model.set_requires_gradient_sync(False)
        model(x, x).backward()
        assert unsharded_grad_bytes() == 4 * n
        assert all(p.grad is None for p in model.parameters())  # nothing sharded yet
        model.set_requires_gradient_sync(True)
        model(x, x).backward()
        assert unsharded_grad_bytes() == 0
        assert sum(p.grad.numel() * 4 for p in model.parameters()) == 4 * n


def _alive_saved_bytes(model, tokens) -> int:
    """Bytes of the distinct storages autograd saved in one bf16 forward with the loss, as they
    are when the forward returns: FSDP2 has freed by then the gathered weights it resharded."""
    storages: dict[int, torch.UntypedStorage] = {}  # by storage object: FSDP2 frees gathered
    # weights during the forward, and a later tensor may take a freed one's address

    def pack(x):
        s = x.untyped_storage()
        storages.setdefault(s._cdata, s)  # kept alive here, so no other storage takes its id
        return x

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens, tokens)
    return sum(s.nbytes() for s in storages.values())


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_bf16_all_gather_saves_the_weight_copies_the_estimate_says(preset):
    """FSDP2 in a gloo group of one, as ``ablate.train.parallel`` wraps it: what autograd still
    holds at the end of the forward with the fp32 all-gather minus with the bf16 one is the block
    linears' bf16 weight copies, within 2% of the estimate's difference (and the estimate's
    unsharded working set is computed as its docstring says)."""
    from ablate.train.parallel import Ranks

    cfg = ModelConfig(preset=preset)
    tokens = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(0))
    alive = {}
    with _group_of_one():
        for all_gather in ("fp32", "bf16"):
            model = build_model(cfg, 257)
            Ranks("fsdp", 0, 1, all_gather).wrap(model, torch.device("cpu"))
            alive[all_gather] = _alive_saved_bytes(model, tokens)
    kw = dict(batch_size=2, grad_accum=1, seq_len=64, precision="bf16", parallel="fsdp")
    est = {ag: estimate(cfg, 257, all_gather=ag, **kw) for ag in ("fp32", "bf16")}
    saved = est["fp32"].weight_copies - est["bf16"].weight_copies
    c = cfg.resolved(257)
    block_linears = sum(
        m.weight.numel()
        for m in build_model(cfg, 257).layers.modules()
        if isinstance(m, torch.nn.Linear)
    )
    assert saved == 2 * block_linears  # every block linear's bf16 copy, the LM head's kept
    assert alive["fp32"] - alive["bf16"] == pytest.approx(saved, rel=0.02)
    assert (
        est["bf16"].fsdp_unsharded
        == fsdp_unsharded(c, 1, "bf16")
        < fsdp_unsharded(c, 1) + (2 * block_linears // c.n_layers)
    )
    with pytest.raises(ValueError, match="all_gather: bf16 needs parallel fsdp and precision"):
        estimate(cfg, 257, all_gather="bf16", **(kw | {"precision": "fp32"}))


def test_ddp_keeps_full_replicas_plus_its_gradient_buckets():
    cfg = ModelConfig(preset="small")
    step = dict(grad_accum=2, seq_len=128, precision="bf16")
    one = estimate(cfg, 257, batch_size=16, **step)
    ddp = estimate(cfg, 257, batch_size=16, **step, workers=4, parallel="ddp")
    per_worker = estimate(cfg, 257, batch_size=4, **step)
    assert (ddp.micro_batch, one.micro_batch) == (2, 8)
    assert ddp.activations == per_worker.activations < one.activations / 3
    for part in ("parameters", "gradients", "optimizer", "weight_copies"):
        assert getattr(ddp, part) == getattr(one, part), part
    assert ddp.ddp_buckets == 4 * ddp.n_params and ddp.fsdp_unsharded == 0 and ddp.shards == 1
    assert ddp.short().startswith("ddp x4: ") and "ddp buckets" in ddp.short()
    with pytest.raises(ValueError, match="none trains in one process"):
        estimate(cfg, 257, batch_size=16, **step, workers=4)
    with pytest.raises(ValueError, match="does not split"):
        estimate(cfg, 257, batch_size=12, **step, workers=4, parallel="ddp")


def test_ddp_buckets_are_one_fp32_copy_of_the_gradients():
    """What DDP (as ``ablate.train.parallel`` builds it: gradient_as_bucket_view off) allocates
    for its all-reduce: buckets of 4 bytes per parameter, read from its logging data (gloo, one
    process, the CPU)."""
    from torch.nn.parallel import DistributedDataParallel

    model = build_model(ModelConfig(preset="tiny"), 257)
    with _group_of_one():
        data = DistributedDataParallel(model)._get_ddp_logging_data()
    assert not data["gradient_as_bucket_view"]
    buckets = sum(int(b) for b in str(data["bucket_sizes"]).split(","))
    step = dict(batch_size=2, grad_accum=1, seq_len=32, precision="fp32")
    est = estimate(ModelConfig(preset="tiny"), 257, **step, workers=2, parallel="ddp")
    assert buckets == est.ddp_buckets == 4 * count_parameters(model)


def test_estimate_run_follows_the_cells_parallel_mode():
    from ablate.train.config import RunConfig, TrainConfig

    def run(**train) -> RunConfig:
        tc = TrainConfig(batch_size=16, grad_accum=2, seq_len=64, precision="fp32", **train)
        return RunConfig(model=ModelConfig(preset="tiny"), train=tc, device="cpu")

    none, ddp = estimate_run(run()), estimate_run(run(workers=2))  # auto: ddp with 2 workers
    fsdp = estimate_run(run(workers=2, parallel="fsdp"))
    assert (none.parallel, ddp.parallel, fsdp.parallel) == ("none", "ddp", "fsdp")
    assert (none.micro_batch, ddp.micro_batch, fsdp.micro_batch) == (8, 4, 4)
    assert ddp.workers == fsdp.workers == 2 and fsdp.parameters == -(-none.parameters // 2)
    one_process_group = estimate_run(run(parallel="fsdp"))  # fsdp x1: the distributed path
    assert one_process_group.parameters == none.parameters and one_process_group.fsdp_unsharded


def test_parse_size():
    assert parse_size("80GiB") == 80 << 30
    assert parse_size("24 gb") == 24 * 10**9
    assert parse_size("1.5MiB") == 3 << 19
    for bad in ("80", "80TB", "GiB", "-1GiB", "0GiB", "eighty GiB"):
        with pytest.raises(ValueError, match="GiB, GB, MiB or MB"):
            parse_size(bad)


def test_format_bytes():
    assert format_bytes(80 << 30) == "80 GiB"
    assert format_bytes(1020 << 20) == "1020 MiB"
    assert format_bytes(3 << 19) == "1.5 MiB"
