"""Data-parallel training (``ablate.train.parallel``): the ranks' random streams, the equivalence of
W workers with one, sharded checkpoints and exact resume, in real torch.distributed process groups
(gloo): a group of one in this process, and two processes forked from a server that has imported
torch (``ranks.spawn``). The Ray Train path through ``ablate run`` is in test_distributed_ray.py."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ranks
import torch
import torch.distributed as dist

from ablate.errors import CheckpointError
from ablate.train import RunConfig, train
from ablate.train.branch import Branches, branch_point, family_hash, prefix_hash
from ablate.train.checkpoint import checkpoint_info, load_file, rekey_checkpoint
from ablate.train.config import config_hash
from ablate.train.damage import checkpoint_damage, load_damage
from ablate.train.device import resolve_device
from ablate.train.parallel import process_group
from backends.layer import QuantLinear
from backends.layer.streams import key_prefixes, per_rank
from backends.quant.rng import GEMM_IDS, OPERAND_IDS, derive_key
from backends.recipes import GEMMS, OPERANDS, Recipe

SR_RECIPE = Recipe.from_shorthand(GEMMS, "sr").to_dict()
RHT_RECIPE = Recipe.from_shorthand(GEMMS, "sr+rht16").to_dict()
IMPORTED_BY = os.getpid()
"""The process that imported this module: in a rank, the fork server that preloaded it."""


def cfg(
    parallel: str = "none",
    workers: int = 1,
    *,
    recipe: dict[str, Any] | None = None,
    steps: int = 6,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 0,
    grad_accum: int = 1,
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "model": {"preset": "tiny"},
        "data": {"val_tokens": 4096},
        "device": "cpu",
        "train": {
            "steps": steps,
            "batch_size": 4,
            "seq_len": 32,
            "eval_every": 3,
            "eval_batches": 4,
            "warmup_steps": 2,
            "parallel": parallel,
            "workers": workers,
            "grad_accum": grad_accum,
            "checkpoint_every": checkpoint_every,
        },
    }
    if recipe is not None:
        d["recipe"] = recipe
    if checkpoint_dir is not None:
        d["checkpoint_dir"] = str(checkpoint_dir)
    return d


def losses(d: dict[str, Any], stop_after: int | None = None) -> list[float]:
    """Validation losses of a run in this process (a group of one for ddp/fsdp)."""
    c = RunConfig.from_dict(d)
    with process_group(c, resolve_device("cpu")):
        return [e.val_loss for e in train(c, stop_after=stop_after).evals]


# --- the ranks' random streams ------------------------------------------------------------------------


def test_rank_zero_keeps_the_keys_of_one_process_and_other_ranks_differ_only_per_rank():
    base = key_prefixes(7, 3)
    assert torch.equal(key_prefixes(7, 3, rank=0), base)
    r1 = key_prefixes(7, 3, rank=1)
    for i, g in enumerate(GEMMS):
        for j, stream in enumerate((*OPERANDS[g], "signs")):
            assert (r1[i, j] != base[i, j]) == per_rank(g, stream), (g, stream)
    # the weight's streams and the fprop/dgrad signs are shared: W is quantized alike everywhere
    assert not per_rank("fprop", "w") and not per_rank("dgrad", "w")
    assert not per_rank("fprop", "signs") and not per_rank("dgrad", "signs")
    assert per_rank("fprop", "x") and per_rank("dgrad", "dy") and per_rank("wgrad", "signs")
    assert not torch.equal(key_prefixes(7, 3, rank=2), r1)


def test_a_layers_device_keys_and_python_keys_agree_on_every_rank():
    layer = QuantLinear(32, 32, recipe=Recipe.from_dict(SR_RECIPE), layer_id=2, seed=5)
    for rank in (0, 1, 3):
        layer.rank = rank
        call = torch.tensor(11, dtype=torch.int64)
        table = layer.key_table(call)
        for g in GEMMS:
            dev, py = layer.keys(g, call, table), layer.keys(g, 11)
            assert (int(dev.a), int(dev.b), int(dev.signs)) == (py.a, py.b, py.signs)
    a_op = OPERANDS["fprop"][0]
    expect = derive_key(5, 2, GEMM_IDS["fprop"], OPERAND_IDS[a_op], (1 << 40) + 3, 11)
    assert layer.keys("fprop", 11).a == expect


def test_a_loaded_checkpoint_keeps_the_layers_rank():
    layer = QuantLinear(32, 32, recipe=Recipe.from_dict(SR_RECIPE), layer_id=1, seed=5)
    layer.rank = 1
    other = QuantLinear(32, 32, recipe=Recipe.from_dict(SR_RECIPE), layer_id=1, seed=9)
    layer.load_state_dict(other.state_dict())
    assert torch.equal(layer.key_prefix, key_prefixes(9, 1, rank=1))


# --- one process: the distributed code path in a group of one ------------------------------------------


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_group_of_one_trains_bit_identically_to_one_process(mode):
    ref = losses(cfg(recipe=SR_RECIPE, grad_accum=2))
    assert losses(cfg(mode, recipe=SR_RECIPE, grad_accum=2)) == ref


def test_a_sharded_checkpoint_is_atomic_and_resumes_exactly(tmp_path):
    ref = losses(cfg("fsdp", recipe=SR_RECIPE, steps=6))
    d = cfg("fsdp", recipe=SR_RECIPE, steps=6, checkpoint_dir=tmp_path, checkpoint_every=2)
    losses(d, stop_after=3)  # checkpoints at 2 and at the stop
    info = checkpoint_info(tmp_path)
    assert info is not None and info["format"] == "sharded" and info["step"] == 3
    assert [p.name for p in (tmp_path / "sharded").iterdir()] == [Path(info["path"]).name]
    assert (tmp_path / info["path"] / ".metadata").is_file()
    # a write that a kill left half done is ignored, and cleaned up by the next checkpoint
    (tmp_path / "sharded" / "step-000000004-dead.tmp").mkdir()
    assert losses(d) == ref
    info = checkpoint_info(tmp_path)
    assert info is not None and info["status"] == "finished"
    assert len(list((tmp_path / "sharded").iterdir())) == 1


def test_a_sharded_checkpoint_refuses_another_parallel_layout(tmp_path):
    losses(cfg("fsdp", steps=2, checkpoint_dir=tmp_path))
    with pytest.raises(ValueError, match="checkpoint_dir: .* sharded checkpoint .* one process"):
        losses(cfg("none", steps=2, checkpoint_dir=tmp_path))
    other = tmp_path / "other"
    losses(cfg("none", steps=2, checkpoint_dir=other))
    with pytest.raises(ValueError, match="checkpoint_dir: .* one-process checkpoint"):
        losses(cfg("ddp", steps=2, checkpoint_dir=other))


@pytest.fixture(scope="module")
def sharded_at_2(tmp_path_factory) -> tuple[Path, list[float]]:
    """A group of one's sharded checkpoint of step 2 (of 4), and the run's losses from step 0."""
    ck = tmp_path_factory.mktemp("sharded") / "ck"
    d = cfg("ddp", steps=4, checkpoint_dir=ck, checkpoint_every=2)
    losses(d, stop_after=2)
    return ck, losses(cfg("ddp", steps=4))


class _Payload:
    """Unpickled without restriction, it creates ``marker`` (as ``test_untrusted.Payload``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _damage(step: Path, damage: str) -> None:
    """Damage a sharded checkpoint's folder as a full disk or a lost file would."""
    shard = next(step.glob("*.distcp"))
    if damage == "no metadata":
        (step / ".metadata").unlink()
    elif damage == "metadata truncated":
        (step / ".metadata").write_bytes((step / ".metadata").read_bytes()[:100])
    elif damage == "shard truncated":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "no rng of rank 1":
        (step / "rng-rank1.pt").unlink()
    else:
        assert damage == "train state truncated"
        (step / "train_state.pt").write_bytes((step / "train_state.pt").read_bytes()[:500])


@pytest.mark.parametrize(
    "damage", ["no metadata", "metadata truncated", "shard truncated", "train state truncated"]
)
def test_a_damaged_sharded_checkpoint_is_set_aside_and_the_run_trains_from_step_0(
    sharded_at_2, tmp_path, damage
):
    src, ref = sharded_at_2
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    info = checkpoint_info(ck)
    assert info is not None and info["step"] == 2
    _damage(ck / info["path"], damage)
    # what `ablate plan` sees from the files' ends: all but a shard's length (the run reads that)
    assert (checkpoint_damage(ck) is None) == (damage == "shard truncated")
    assert load_damage(ck) is not None  # as the run finds it (its worker logs it from step 0)
    kept = {p.relative_to(ck): p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    d = cfg("ddp", steps=4, checkpoint_dir=ck, checkpoint_every=2)
    with pytest.warns(RuntimeWarning, match=r"damaged.*; set aside \(kept\) as .*ck\.damaged-"):
        assert losses(d) == ref  # from step 0: every step computed again
    (aside,) = tmp_path.glob("ck.damaged-*")  # kept as it was, its sidecar with it
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == kept
    info = checkpoint_info(ck)
    assert info is not None and (info["step"], info["status"]) == (4, "finished")


def test_a_sharded_checkpoint_with_poisoned_metadata_is_refused_not_set_aside(
    sharded_at_2, tmp_path
):
    src, _ = sharded_at_2
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    info = checkpoint_info(ck)
    assert info is not None
    marker = tmp_path / "ran"
    (ck / info["path"] / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    hint = rf"; ablate will not load it: .*`mv {re.escape(f'{ck} {ck}.refused')}`.*--rerun-failed"
    with pytest.raises(CheckpointError, match=rf"\.metadata: refused, not loaded.*{hint}"):
        losses(cfg("ddp", steps=4, checkpoint_dir=ck))
    assert not marker.exists() and not list(tmp_path.glob("ck.*"))


def test_a_sharded_checkpoint_the_file_system_fails_to_read_is_not_set_aside(
    sharded_at_2, tmp_path
):
    """Its ``.metadata`` read with EIO (as a failing disk or a lost NFS server does: a link to
    ``/proc/self/mem``, whose first page is never mapped): no damage, the attempt fails on it
    (and is retried), the checkpoint left where it is."""
    if not Path("/proc/self/mem").exists():
        pytest.skip("no /proc/self/mem here")
    src, _ = sharded_at_2
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    info = checkpoint_info(ck)
    assert info is not None
    (ck / info["path"] / ".metadata").unlink()
    (ck / info["path"] / ".metadata").symlink_to("/proc/self/mem")
    with pytest.raises(OSError) as e:
        losses(cfg("ddp", steps=4, checkpoint_dir=ck))
    assert e.value.errno == errno.EIO
    assert not list(tmp_path.glob("ck.*")) and checkpoint_info(ck) == info


def test_an_adopted_sharded_checkpoint_resumes_exactly_under_its_new_key(sharded_at_2, tmp_path):
    """``ablate adopt``'s re-key (``rekey_checkpoint``) of a sharded checkpoint recorded under an
    older key: its train state, which the ranks check, and its sidecar then name the cell's key,
    and the run resumes from step 2 as it trains from step 0 (under the old key it is refused)."""
    src, ref = sharded_at_2
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    d = cfg("ddp", steps=4, checkpoint_dir=ck, checkpoint_every=2)
    key = config_hash(RunConfig.from_dict(d))
    old = config_hash(RunConfig.from_dict(d), numerics=1)
    info = checkpoint_info(ck)
    assert info is not None and info["config_hash"] == key and info["step"] == 2
    state = ck / info["path"] / "train_state.pt"  # as numerics 1 recorded it: the old key
    torch.save(load_file(state) | {"config_hash": old}, state)
    (ck / "checkpoint.json").write_text(json.dumps(info | {"config_hash": old}))
    with pytest.raises(ValueError, match=rf"written by a different configuration \({old} !="):
        losses(d)
    assert rekey_checkpoint(ck, key)
    assert checkpoint_info(ck) == info and load_file(state)["config_hash"] == key
    assert losses(d) == ref


# --- two processes -------------------------------------------------------------------------------------


def _rank_main(rank: int, world: int, tmp: str, d: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        import ablate.train.loop as loop

        built: list[torch.nn.Module] = []
        build = loop.build_model

        def keep(*args: Any, **kw: Any) -> torch.nn.Module:
            built.append(build(*args, **kw))
            return built[-1]

        loop.build_model = keep  # type: ignore[assignment]
        d = dict(d)
        branches = d.pop("_branches", None)  # a family's member: Branches.to_dict()
        stop_after = d.pop("_stop_after", None)
        b = Branches.from_dict(branches) if branches else None
        start = b.start if b is not None else None  # where a branch starts: its checkpoint's step
        res = train(RunConfig.from_dict(d), branches=b, stop_after=stop_after)
        out: dict[str, Any] = {"evals": [e.val_loss for e in res.evals], "start": start}
        layers = [m for m in built[0].modules() if isinstance(m, QuantLinear)]
        if layers and not layers[0].recipe.fprop.high_precision:
            # what this rank's layer 0 draws at the last call, for the same fixed operands
            from backends.quant import quantize

            layer, call = layers[0], int(layers[0].calls) - 1
            g = layer.recipe.fprop
            assert g.a is not None and g.b is not None
            fixed = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
            k = layer.keys("fprop", call)
            w = layer.weight.full_tensor() if hasattr(layer.weight, "full_tensor") else layer.weight
            out["w_q"] = quantize(w.detach(), g.b, axis=1, key=k.b).dequantize().tolist()
            out["x_q"] = quantize(fixed, g.a, axis=1, key=k.a).dequantize().tolist()
            signs = layer.signs("wgrad", layer.keys("wgrad", call))
            fprop_signs = layer.signs("fprop", k)  # None: no Hadamard transform there
            out["signs"] = None if signs is None else signs.tolist()
            out["fprop_signs"] = None if fprop_signs is None else fprop_signs.tolist()
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's finalization: on torch 2.11 a gloo worker thread can drop the
    # last reference to a finished collective while Python finalizes, which aborts the process
    # ("terminate called without an active exception"; about one 2-rank FSDP run in four on the
    # 2-core machine, after everything was written). torch keeps the group alive past
    # destroy_process_group once DDP or FSDP2 has used it, so its threads outlive the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def two_ranks(d: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        ranks.spawn(_rank_main, args=(2, tmp, d), nprocs=2)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def _rank_0_decides_main(rank: int, tmp: str) -> None:
    """Both ranks set aside a damaged checkpoint that rank 0 cannot rename (its folder is gone, as
    one EACCES or EBUSY refuses), then load a branch checkpoint that each rank sees in a folder of
    its own (``view<rank>``: nodes whose views of a file system differ), each recording what it
    raised or returned and after how long. Rank 0 then stays in the group until rank 1 has (a
    Ray worker's process outlives its error), so that a rank left waiting would wait for the
    group's timeout."""
    from datetime import timedelta

    import ablate.train.branch as branch
    from ablate.errors import DamagedCheckpointError
    from ablate.train.checkpoint import set_aside
    from ablate.train.parallel import Ranks

    loads: list[str] = []  # the branch checkpoints this rank began to load
    load = branch.load_sharded

    def counted(path: Path, **kw: Any) -> Any:
        loads.append(str(path))
        return load(path, **kw)

    branch.load_sharded = counted  # type: ignore[assignment]

    store = dist.FileStore(os.path.join(tmp, "store"), 2)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=15)
    )
    ddp = Ranks("ddp", rank, 2)
    t0, raised = time.monotonic(), None
    try:
        set_aside(Path(tmp, "gone"), DamagedCheckpointError("damaged"), ddp)
    except Exception as e:  # noqa: BLE001 (what each rank raised is the result)
        raised = f"{type(e).__name__}: {e}"
    result: dict[str, Any] = {"raised": raised, "s": time.monotonic() - t0}
    for case in ("rank 1 sees it", "rank 0 sees it"):
        t0, got = time.monotonic(), None
        b = Branches(root=os.path.join(tmp, case, f"view{rank}"), family="f", start_at=6)
        kw: dict[str, Any] = dict(model=torch.nn.Linear(2, 2), optimizer=None, sampler=None)
        try:  # nothing is restored: no rank starts from it, or rank 0 finds it damaged
            state = branch.load_branch(b, ranks=ddp, **kw)
            got = None if state is None else state.step
        except Exception as e:  # noqa: BLE001
            got = f"{type(e).__name__}: {e}"
        result[case] = {"state": got, "loaded": bool(loads), "s": time.monotonic() - t0}
        loads.clear()
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(result))
    deadline = time.monotonic() + 30
    while rank == 0 and not Path(tmp, "rank1.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _sharded_branch_checkpoint(folder: Path) -> None:
    """A sharded branch checkpoint of family ``f`` at step 6 that is ready (its files' ends are
    whole) but that rank 0's check finds damaged (its train state holds nothing)."""
    step = folder / "step-000000006"
    (step / "sharded" / "s").mkdir(parents=True)
    for name in ("train_state.pt", "rng-rank0.pt", "rng-rank1.pt"):
        torch.save({}, step / "sharded" / "s" / name)
    (step / "sharded" / "s" / ".metadata").write_bytes(pickle.dumps({}))
    sidecar = {"step": 6, "status": None, "config_hash": "f", "format": "sharded"}
    sidecar |= {"path": "sharded/s", "world": 2, "parallel": "ddp"}
    (step / "checkpoint.json").write_text(json.dumps(sidecar))
    assert Branches(root=str(folder), family="f", start_at=6).ready(6)


def test_every_rank_takes_rank_0s_word_on_setting_aside_and_on_a_branch_checkpoint(tmp_path):
    """Rank 0's rename raised; the other ranks learn it at once and raise too, naming it, instead
    of waiting for rank 0 in a barrier until the process group times out. And where ranks see a
    branch checkpoint differently, every rank takes rank 0's verdict on it: none starts from it
    where rank 0 sees none; where rank 0 sees one, every rank loads it with rank 0, which here
    finds it damaged and sets it aside once (before, each rank judged it: one loaded, the other
    trained from step 0, and the loading rank waited for the other until the group timed out)."""
    _sharded_branch_checkpoint(tmp_path / "rank 1 sees it" / "view1")
    _sharded_branch_checkpoint(tmp_path / "rank 0 sees it" / "view0")
    ranks.spawn(_rank_0_decides_main, args=(str(tmp_path),), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["raised"].startswith("FileNotFoundError") and r0["s"] < 5
    assert r1["raised"].startswith(f"OSError: {tmp_path / 'gone'}: rank 0 failed to set it aside")
    assert r1["raised"].endswith(f"({r0['raised']})") and r1["s"] < 5, r1
    for case, loaded in (("rank 1 sees it", False), ("rank 0 sees it", True)):
        assert r0[case]["loaded"] == r1[case]["loaded"] == loaded, (case, r0, r1)
        assert r0[case]["state"] is None and r1[case]["state"] is None, (case, r0, r1)  # step 0
        assert r0[case]["s"] < 5 and r1[case]["s"] < 5, (case, r0, r1)
    assert (tmp_path / "rank 1 sees it" / "view1" / "step-000000006").is_dir()  # not rank 0's
    assert len(list((tmp_path / "rank 0 sees it" / "view0").glob("step-*.damaged-*"))) == 1


def _importer(rank: int, out: str) -> None:
    Path(out).write_text(json.dumps({"module": IMPORTED_BY, "rank": os.getpid()}))


@pytest.mark.slow
def test_a_rank_finds_its_test_module_imported_by_the_fork_server(tmp_path):
    """``ranks.PRELOAD``'s test modules come from the server (a rank that imported one again
    would pay pytest's and torch's imports anew)."""
    out = tmp_path / "importer.json"
    ranks.spawn(_importer, args=(str(out),), nprocs=1)
    seen = json.loads(out.read_text())
    assert seen["module"] not in (seen["rank"], os.getpid()), seen


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_workers_on_half_batches_train_what_one_worker_does(mode):
    """High precision: 2 workers x B/2 and 1 worker x B agree to 1e-5 nats (the reduction's float
    order is the only difference; measured about 1e-6 after 9 steps)."""
    ref = losses(cfg(steps=9, grad_accum=2))
    ranks = two_ranks(cfg(mode, 2, steps=9))
    assert ranks[0]["evals"] == ranks[1]["evals"]  # every rank holds the same numbers
    assert len(ranks[0]["evals"]) == len(ref) == 4
    for a, b in zip(ranks[0]["evals"], ref, strict=True):
        assert abs(a - b) < 1e-5, (a, b)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_ranks_quantize_the_weight_alike_and_draw_their_own_noise(mode):
    """MXFP4 with SR and a random Hadamard on every GEMM, 2 workers, after training: both ranks
    hold the same weight and quantize it to the same values, rotate fprop alike, but round their
    own operands (X) with their own noise and rotate wgrad with their own signs."""
    r0, r1 = two_ranks(cfg(mode, 2, recipe=RHT_RECIPE, steps=2))
    assert r0["evals"] == r1["evals"]
    assert r0["w_q"] == r1["w_q"]
    assert r0["fprop_signs"] == r1["fprop_signs"]
    assert r0["x_q"] != r1["x_q"]
    assert r0["signs"] != r1["signs"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_warmup_on_two_ranks_trains_its_steps_as_the_warmup_recipe_does(mode, tmp_path):
    """A precision schedule on two ranks: MXFP4 + SR + RHT16 after 3 steps of FP8 evaluates at
    steps 0 and 3 exactly as the FP8 run on two ranks does, then as its own recipe; both ranks
    hold the same numbers. Trained as a branch of the FP8 run (whose ranks save a sharded branch
    checkpoint at step 3), it ends with the same numbers, bits included."""
    fp8 = Recipe.from_shorthand([], base="fp8").to_dict()
    d = cfg(mode, 2, recipe=RHT_RECIPE)
    d["phases"] = [{"name": "warmup", "start": 0, "end": 3, "recipe": fp8}]
    r0, r1 = two_ranks(d)
    hashes = ((3, prefix_hash(RunConfig.from_dict(d), 3)),)
    family = Branches(root=str(tmp_path), family="warmup", hashes=hashes)
    trunk = {**cfg(mode, 2, recipe=fp8), "_branches": replace(family, save_at=(3,)).to_dict()}
    f0, _ = two_ranks(trunk)
    r0.pop("start"), r1.pop("start")
    assert r0["evals"] == r1["evals"] and len(r0["evals"]) == 3
    assert r0["evals"][:2] == f0["evals"][:2] and r0["evals"][2] != f0["evals"][2]
    info = checkpoint_info(family.dir(3))
    assert info is not None and info["format"] == "sharded" and info["world"] == 2
    b0, b1 = two_ranks({**d, "_branches": replace(family, start_at=3).to_dict()})
    assert b0.pop("start") == b1.pop("start") == 3  # from the trunk's sharded checkpoint
    assert b0 == r0 and b1 == r1


@pytest.mark.slow
def test_a_wsd_budget_on_two_ranks_branches_from_its_trunks_sharded_checkpoint(tmp_path):
    """Budgets 6 and 9 of one wsd config on two FSDP ranks: the 9-step trunk saves a sharded
    branch checkpoint at the 6-step budget's decay start, and the budget trained from it ends
    with the numbers of the budget trained from step 0."""

    def wsd(steps: int) -> dict[str, Any]:
        d = cfg("fsdp", 2, recipe=SR_RECIPE, steps=steps)
        d["train"]["schedule"] = "wsd"
        return d

    point = branch_point(RunConfig.from_dict(wsd(6)))
    assert point is not None and 0 < point < 6
    family = Branches(root=str(tmp_path), family=family_hash(RunConfig.from_dict(wsd(9))))
    two_ranks({**wsd(9), "_branches": replace(family, save_at=(point,)).to_dict()})
    direct, _ = two_ranks(wsd(6))
    b0, _ = two_ranks({**wsd(6), "_branches": replace(family, start_at=point).to_dict()})
    assert b0.pop("start") == point and direct.pop("start") is None
    assert b0 == direct


@pytest.mark.slow
def test_two_ranks_set_a_damaged_sharded_checkpoint_aside_once_and_train_from_step_0(tmp_path):
    """Rank 1's RNG state lost: rank 0 finds it before any rank loads, sets the folder aside
    once, and both ranks train from step 0 (before, rank 1 alone failed, at every rerun)."""
    ck = tmp_path / "ck"
    d = cfg("ddp", 2, steps=4, checkpoint_dir=ck, checkpoint_every=2)
    two_ranks({**d, "_stop_after": 2})
    info = checkpoint_info(ck)
    assert info is not None and (info["step"], info["world"]) == (2, 2)
    _damage(ck / info["path"], "no rng of rank 1")
    assert checkpoint_damage(ck) is not None  # as `ablate plan` says
    r0, r1 = two_ranks(d)
    assert r0["evals"] == r1["evals"] and len(r0["evals"]) == 3  # steps 0, 3 and 4
    (aside,) = tmp_path.glob("ck.damaged-*")
    assert (aside / info["path"] / "rng-rank0.pt").is_file()
    assert not (aside / info["path"] / "rng-rank1.pt").exists()
    info = checkpoint_info(ck)
    assert info is not None and (info["step"], info["status"]) == (4, "finished")


@pytest.mark.slow
def test_ranks_with_shared_draws_draw_rank_0s_noise_as_megatron_does():
    """``train.rank_draws: shared``: every rank rounds its own operands with rank 0's stream and
    rotates wgrad with rank 0's signs (the seed paper's Megatron runs), the weight alike."""
    d = cfg("ddp", 2, recipe=RHT_RECIPE, steps=2)
    d["train"]["rank_draws"] = "shared"
    r0, r1 = two_ranks(d)
    assert r0["evals"] == r1["evals"] and r0["w_q"] == r1["w_q"]
    assert r0["x_q"] == r1["x_q"] and r0["signs"] == r1["signs"]


# --- the study vocabulary --------------------------------------------------------------------------------


def _spec(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "w",
        "base": {"device": "cpu", "model": {"preset": "tiny"}, "train": {"batch_size": 8}},
        "grid": {"seed": [0]},
        "resources": {"cpus": 1, "workers": 2},
    }
    for k, v in over.items():
        raw[k] = v
    return raw


def test_resources_workers_reaches_the_runs_and_bad_combinations_name_their_field(tmp_path):
    from ablate.errors import StudyError
    from ablate.study import parse_study

    s = parse_study(_spec(), output=tmp_path)
    tc = s.cells[0].config.train
    assert (tc.workers, tc.resolved_parallel) == (2, "ddp")
    one = parse_study({**_spec(), "resources": {"cpus": 1}}, output=tmp_path)
    assert s.cells[0].key != one.cells[0].key  # workers are in the key
    assert one.cells[0].config.train.resolved_parallel == "none"
    bad = [
        ({"base": {"train": {"batch_size": 5}}}, "train.batch_size: 5 sequences do not split"),
        ({"base": {"train": {"workers": 4, "batch_size": 8}}}, "base.train.workers: 4, but"),
        ({"base": {"train": {"parallel": "none", "batch_size": 8}}}, "train.parallel: none"),
        (
            {"base": {"train": {"parallel": "zero3", "batch_size": 8}}},
            "base.train.parallel: Input should be 'auto', 'none', 'ddp' or 'fsdp'",
        ),
        ({"probe": {"every": 5}}, "probe: probes run in one process"),
    ]
    for over, says in bad:
        with pytest.raises(StudyError, match=says.replace("(", r"\(")):
            parse_study(_spec(**over), output=tmp_path)
