"""Hugging Face checkpoints out (``ablate.export``, ``ablate export``): a trained ``tiny`` cell
exported and loaded by ``transformers``' ``AutoModelForCausalLM`` gives ablate's logits on the
validation tokens (float32, max abs difference <= 1e-5) and the validation loss the run recorded in
MLflow; a recipe's quantized cell exports its master weights (the same logits and loss: an MXFP4
wgrad recipe leaves the forward unquantized); a sharded checkpoint of a distributed run exports the
same weights as one process; a Hugging Face tokenizer travels with the export; an untied head maps
too; a baseline seed reused from another study exports that study's checkpoint; and the export
refuses an unknown cell, a cell without a checkpoint, and a folder in use."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ablate.cli import main
from ablate.data import load_data, val_batches
from ablate.driver.runner import run_study
from ablate.export import ExportError, export_cell, export_checkpoint, export_model
from ablate.model import build_model
from ablate.study import load_study
from ablate.tracking import read_histories, study_status
from ablate.train import RunConfig, train
from ablate.train.checkpoint import CHECKPOINT
from ablate.train.parallel import process_group

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOL = 1e-5
"""Max abs difference of float32 logits, and of validation losses (measured: below 1e-6)."""

STUDY = """
name: exporttest
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 4, batch_size: 4, seq_len: 32, eval_every: 2, warmup_steps: 1}
grid:
  - fp4_gemms: [[], [wgrad]]
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study run once for the module, interrupted after 2 steps (its first cell exported
    then), then to its end: (its file, its output folder, the interrupted cell's export)."""
    tmp = tmp_path_factory.mktemp("export")
    p = tmp / "s.yaml"
    p.write_text(STUDY)
    out = tmp / "out"
    s = load_study(p, output=out)
    run_study(s, executor="local", progress=False, stop_after=2)
    early = export_cell(p, s.cells[0].label, tmp / "early", output=out)
    res = CliRunner().invoke(
        main, ["run", str(p), "-o", str(out), "--executor", "local", "--quiet"]
    )
    assert res.exit_code == 0, res.output
    return p, out, early


def _ablate_model(config: RunConfig, checkpoint: Path) -> torch.nn.Module:
    ck = torch.load(checkpoint / "checkpoint.pt", map_location="cpu", weights_only=False)
    model = build_model(
        config.model,
        ck["model"]["tok_embeddings.weight"].shape[0],
        recipe=config.recipe,
        backend=config.backend,
        seed=config.seed,
    )
    model.load_state_dict(ck["model"])
    return model.eval()


def _val(config: RunConfig, cache: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = load_data(config.data, cache=cache)
    return val_batches(data.val, config.train.seq_len, config.train.batch_size)


def _hf_loss(hf, batches) -> float:
    """The token-weighted mean cross-entropy over the batches, as the trainer's ``evaluate``."""
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            logits = hf(x).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            total, count = total + float(loss) * y.numel(), count + y.numel()
    return total / count


def _load(folder: Path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return hf.eval()


@pytest.mark.slow
@pytest.mark.parametrize("label", ["bf16", "mxfp4[wgrad]"])
def test_an_exported_cell_loads_as_llama_with_ablates_logits_and_recorded_val_loss(
    study, tmp_path, label
):
    p, out, _ = study
    s = load_study(p, output=out)
    cell = next(c for c in s.cells if c.label.split("/")[0] == label)
    dest = tmp_path / "hf"
    res = CliRunner().invoke(
        main, ["export", str(p), "--output", str(out), "--cell", cell.label, "-o", str(dest)]
    )
    assert res.exit_code == 0, res.output
    hf = _load(dest)
    assert type(hf).__name__ == "LlamaForCausalLM"
    meta = json.loads((dest / "ablate_export.json").read_text())
    assert meta["cell"] == cell.label and meta["key"] == cell.key and meta["step"] == 4
    assert meta["status"] == "finished" and meta["architecture"] == "LlamaForCausalLM"
    assert meta["tokenizer"]["kind"] == "byte" and "256: EOS" in meta["tokenizer"]["ids"]
    assert not (dest / "tokenizer.json").exists()  # no Hugging Face tokenizer for bytes
    assert any("RoPE scaling" in d for d in meta["departures_from_llama"])
    # the logits of every validation token
    ours = _ablate_model(cell.config, s.checkpoint_dir(cell))
    batches = _val(cell.config, s.data_cache())
    with torch.no_grad():
        diff = max(float((ours(x) - hf(x).logits).abs().max()) for x, _ in batches)
    assert diff <= TOL, diff
    # the validation loss the run recorded at its last step, in MLflow and in its checkpoint
    run = next(cs.run for cs in study_status(s) if cs.cell.key == cell.key)
    assert run is not None and meta["run_id"] == run.run_id
    logged = read_histories(s.tracking_uri, [run.run_id], ["val_loss"])[run.run_id]["val_loss"]
    assert logged[-1][0] == 4
    hf_loss = _hf_loss(hf, batches)
    assert abs(hf_loss - logged[-1][1]) <= TOL, (hf_loss, logged[-1][1])
    assert meta["val_loss"] == pytest.approx(logged[-1][1], abs=1e-12)
    # a quantized cell: the master weights, without the quantized layers' random-stream buffers
    from safetensors import safe_open

    with safe_open(str(dest / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not [k for k in keys if k.endswith(("sr_seed", "calls", "hadamard_signs"))]
    assert "lm_head.weight" not in keys  # tied: written once, as the embedding
    quantized = label != "bf16"
    assert meta["quantized_layers"] == (4 * 7 if quantized else 0)
    assert meta["forward_quantized"] is False and "master weights" in meta["weights"]


@pytest.mark.slow
def test_export_refuses_an_unknown_cell_a_cell_without_checkpoint_and_a_folder_in_use(
    study, tmp_path
):
    p, out, _ = study
    s = load_study(p, output=out)
    res = CliRunner().invoke(
        main, ["export", str(p), "--output", str(out), "--cell", "nope", "-o", str(tmp_path / "x")]
    )
    assert res.exit_code == 2
    assert "no cell 'nope'" in res.output and all(c.label in res.output for c in s.cells)
    assert not (tmp_path / "x").exists()
    # a study that has not run: no checkpoint, and the field that makes one named
    fresh = load_study(p, output=tmp_path / "fresh")
    with pytest.raises(ExportError, match="no checkpoint .* run the study first"):
        export_cell(fresh, s.cells[0].label, tmp_path / "y")
    # a -o that cannot be made is refused before the checkpoint is read (said the "File exists"
    # of mkdir's, after reading it, once)
    with pytest.raises(ExportError, match=r"-o: cannot write .* \(.*s\.yaml is not a folder\)"):
        export_cell(fresh, s.cells[0].label, p / "x")
    with pytest.raises(ExportError, match="-o: an empty path"):  # not the current folder
        export_cell(fresh, s.cells[0].label, "")
    # a folder that holds something is left as it is, unless --force
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    args = ["export", str(p), "--output", str(out), "--cell", s.cells[0].key, "-o", str(used)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "not empty" in res.output and "--force" in res.output
    assert [f.name for f in used.iterdir()] == ["notes.txt"]
    res = CliRunner().invoke(main, [*args, "--force"])
    assert res.exit_code == 0, res.output
    assert (used / "notes.txt").read_text() == "mine" and (used / "config.json").is_file()
    # another model's folder: --force replaces only a previous export's files, never its
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "theirs"}')
    (other / "model.safetensors").write_bytes(b"their weights")
    before = {f.name: f.read_bytes() for f in other.iterdir()}
    res = CliRunner().invoke(main, [*args[:-1], str(other), "--force"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "holds config.json, model.safetensors but no ablate_export.json" in res.output
    assert {f.name: f.read_bytes() for f in other.iterdir()} == before


def test_a_checkpoint_the_file_system_cannot_read_fails_the_export_in_one_line(study, tmp_path):
    # an I/O error (here: reading /proc/self/mem at offset 0) is no refusal of the input (exit 2)
    # nor damage: exit 1, the file named, no traceback, nothing written
    p, out, _ = study
    s = load_study(p, output=out)
    ckpt = s.checkpoint_dir(s.cells[1]) / CHECKPOINT
    kept = tmp_path / "kept.pt"
    ckpt.rename(kept)
    try:
        ckpt.symlink_to("/proc/self/mem")
        args = ["export", str(p), "--output", str(out), "--cell", s.cells[1].label]
        res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "x")])
    finally:
        ckpt.unlink()
        kept.rename(ckpt)
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    assert f"not exported: [Errno 5] Input/output error: '{ckpt}'" in res.output, res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_an_interrupted_cell_exports_its_last_checkpoint(study):
    p, out, early = study
    s = load_study(p, output=out)
    meta = json.loads((early / "ablate_export.json").read_text())
    assert meta["step"] == 2 and meta["status"] == "unfinished"
    run = next(cs.run for cs in study_status(s) if cs.cell.key == s.cells[0].key)
    assert run is not None
    logged = dict(
        read_histories(s.tracking_uri, [run.run_id], ["val_loss"])[run.run_id]["val_loss"]
    )
    assert meta["val_loss"] == pytest.approx(logged[2], abs=1e-12)
    batches = _val(s.cells[0].config, s.data_cache())
    assert abs(_hf_loss(_load(early), batches) - logged[2]) <= TOL


def _recorded(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def test_an_export_into_what_the_study_recorded_is_refused_and_changes_nothing(tmp_path):
    """-o inside the study's output folder (its store, its cells' checkpoints), given as it is,
    through ``..`` or through a symbolic link, is refused naming -o/--out, --force or not, before
    anything is read; what the study recorded stays byte for byte. So is the artifacts folder of a
    SQLite store elsewhere, and a checkpoint's own folder for ``export_checkpoint``."""
    p = tmp_path / "s.yaml"
    p.write_text(STUDY)
    out = tmp_path / "runs" / "exporttest"
    s = load_study(p, output=out)
    cell = s.cells[0]
    ckpt = s.checkpoint_dir(cell)
    config = dataclasses.replace(cell.config, checkpoint_dir=str(ckpt))
    train(config)
    before = _recorded(out)
    (tmp_path / "link").symlink_to(out)
    inside = [out, out / "cells", ckpt, out / "exports" / "new", tmp_path / "link" / "new"]
    inside.append(tmp_path / "elsewhere" / ".." / "runs" / "exporttest" / "new")
    args = ["export", str(p), "--output", str(out), "--cell", cell.key]
    for target in inside:
        for force in ([], ["--force"]):
            res = CliRunner().invoke(main, [*args, "-o", str(target), *force])
            assert res.exit_code == 2, res.output
            assert "-o/--out" in res.output and "inside the study's output folder" in res.output
            assert "give a folder outside it" in res.output and "Traceback" not in res.output
    assert _recorded(out) == before and not (out / "exports").exists()
    with pytest.raises(ExportError, match="-o/--out: .* inside the checkpoint folder it exports"):
        export_checkpoint(config, ckpt, ckpt / "hf")
    store = tmp_path / "store"
    elsewhere = STUDY + f"tracking: {{uri: 'sqlite:///{store}/mlflow.db'}}\n"
    (tmp_path / "t.yaml").write_text(elsewhere)
    with pytest.raises(ExportError, match="inside the artifacts of its MLflow store"):
        export_cell(tmp_path / "t.yaml", cell.key, store / "artifacts" / "x", output=out)
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "exported")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "exported" / "config.json").is_file() and _recorded(out) == before


def _cfg(**over) -> dict:
    d = {
        "model": {"preset": "tiny", "n_layers": 2},
        "data": {"val_tokens": 4096},
        "device": "cpu",
        "train": {"steps": 3, "batch_size": 4, "seq_len": 32, "eval_every": 3, "warmup_steps": 1},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and k in d else v
    return d


@pytest.mark.slow
def test_a_sharded_checkpoint_exports_the_weights_of_one_process(tmp_path):
    one = RunConfig.from_dict(_cfg(checkpoint_dir=str(tmp_path / "one")))
    train(one)
    d = _cfg(checkpoint_dir=str(tmp_path / "fsdp"))
    d["train"] = {**d["train"], "parallel": "fsdp"}
    sharded = RunConfig.from_dict(d)
    with process_group(sharded, torch.device("cpu")):
        train(sharded)
    a = export_checkpoint(one, out_dir=tmp_path / "a")
    b = export_checkpoint(sharded, out_dir=tmp_path / "b")
    assert json.loads((b / "ablate_export.json").read_text())["checkpoint_format"] == "sharded"
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    with pytest.raises(ExportError, match="another configuration"):
        export_checkpoint(one, tmp_path / "fsdp", tmp_path / "c")


def _tree(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def test_a_failed_export_leaves_the_folder_as_it_was(tmp_path):
    """Written into a hidden folder and moved into place: a failure (here the run's tokenizer file
    became unreadable) changes nothing, with --force over a previous export too, leaves no new
    folder behind, and an unwritable -o is refused."""
    good = RunConfig.from_dict(_cfg())
    model = build_model(good.model, 257, seed=0)
    prev = export_model(good, model, tmp_path / "prev")
    (prev / "notes.txt").write_text("mine")
    before = _tree(prev)
    garbage = tmp_path / "tokenizer.json"
    garbage.write_bytes(b"\x00 not a tokenizer \xff")
    bad = RunConfig.from_dict(_cfg(data={"tokenizer": str(garbage)}))
    with pytest.raises(ExportError, match="tokenizer"):
        export_model(bad, model, prev, force=True)
    assert _tree(prev) == before
    with pytest.raises(ExportError, match="tokenizer"):
        export_model(bad, model, tmp_path / "new" / "deep")
    assert not (tmp_path / "new").exists()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["prev", "tokenizer.json"]
    # --force that succeeds replaces the export's files and keeps the others
    other = build_model(good.model, 257, seed=1)
    export_model(good, other, prev, force=True)
    after = _tree(prev)
    assert after["notes.txt"] == b"mine" and after.keys() == before.keys()
    assert after["model.safetensors"] != before["model.safetensors"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["prev", "tokenizer.json"]
    (tmp_path / "afile").write_text("")
    with pytest.raises(ExportError, match="-o: cannot write"):
        export_model(good, model, tmp_path / "afile" / "x")


def test_an_untied_model_with_a_hugging_face_tokenizer_exports_both(tmp_path, train_bpe):
    from tokenizers import Tokenizer

    path = train_bpe(
        tmp_path / "tokenizer.json", ["the quick brown fox jumps over the lazy dog"] * 50
    )
    tok = Tokenizer.from_file(str(path))
    d = _cfg(data={"tokenizer": str(tmp_path / "tokenizer.json")})
    d["model"] = {**d["model"], "tie_embeddings": False, "rope_theta": 500_000.0}
    config = RunConfig.from_dict(d)
    vocab = tok.get_vocab_size()
    model = build_model(config.model, vocab, seed=3).eval()
    with torch.no_grad():  # an untrained head would equal init; make it its own
        model.lm_head.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    out = export_model(config, model, tmp_path / "hf")
    hf = _load(out)
    assert not hf.config.tie_word_embeddings
    x = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((model(x) - hf(x).logits).abs().max()) <= TOL
    at = transformers.AutoTokenizer.from_pretrained(out)
    text = "the lazy fox"
    assert at.encode(text, add_special_tokens=False) == tok.encode(text).ids
    assert at.eos_token == "<|endoftext|>" and hf.config.eos_token_id == at.eos_token_id
    meta = json.loads((out / "ablate_export.json").read_text())
    assert meta["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]
    assert meta["step"] is None and meta["recipe"] == "bf16"


@pytest.mark.slow
def test_a_hugging_face_architectures_cell_exports_as_itself(tmp_path):
    """A ``model: {hf: ...}`` cell (Qwen3's architecture, MXFP4 wgrad) exports under its own names:
    ``AutoModelForCausalLM`` loads a ``Qwen3ForCausalLM`` with the trainer's logits and the
    validation loss the run recorded."""
    qwen3 = Path(__file__).resolve().parents[3] / "studies" / "qwen3_tiny" / "config.json"
    p = tmp_path / "s.yaml"
    p.write_text(
        STUDY.replace("{preset: tiny}", "{hf: " + str(qwen3) + "}").replace(
            "[[], [wgrad]]", "[[wgrad]]"
        )
    )
    out = tmp_path / "out"
    s = load_study(p, output=out)
    run_study(s, executor="local", progress=False)
    cell = s.cells[0]
    dest = export_cell(p, cell.label, tmp_path / "hf", output=out)
    hf = _load(dest)
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    meta = json.loads((dest / "ablate_export.json").read_text())
    assert meta["quantized_layers"] == 4 * 7 and meta["step"] == 4
    ck = torch.load(s.checkpoint_dir(cell) / "checkpoint.pt", map_location="cpu", weights_only=True)
    ours = build_model(cell.config.model, 257, recipe=cell.config.recipe, seed=cell.config.seed)
    ours.load_state_dict(ck["model"])
    ours.eval()
    batches = _val(cell.config, s.data_cache())
    with torch.no_grad():
        diff = max(float((ours(x) - hf(x).logits).abs().max()) for x, _ in batches)
    assert diff <= TOL, diff
    run = next(cs.run for cs in study_status(s) if cs.cell.key == cell.key)
    assert run is not None
    logged = read_histories(s.tracking_uri, [run.run_id], ["val_loss"])[run.run_id]["val_loss"]
    assert abs(_hf_loss(hf, batches) - logged[-1][1]) <= TOL


def test_a_config_without_architectures_exports_as_its_model_types_class(tmp_path):
    """``Qwen3Config(...).save_pretrained`` writes no ``architectures`` (or null); such a run exports as
    the causal-LM class of its ``model_type``, and ``transformers`` loads it with ablate's logits."""
    conf = transformers.Qwen3Config(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    conf.save_pretrained(tmp_path / "qwen3")
    assert json.loads((tmp_path / "qwen3" / "config.json").read_text()).get("architectures") is None
    d = _cfg()
    d["model"] = {"hf": str(tmp_path / "qwen3")}
    config = RunConfig.from_dict(d)
    model = build_model(config.model, 257, seed=0).eval()
    out = export_model(config, model, tmp_path / "hf")
    meta = json.loads((out / "ablate_export.json").read_text())
    assert meta["architecture"] == "Qwen3ForCausalLM"
    hf = _load(out)
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    x = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((model(x) - hf(x).logits).abs().max()) <= TOL


@pytest.mark.slow
def test_a_baseline_seed_reused_from_another_study_exports_that_studys_checkpoint(study, tmp_path):
    """A baseline seed copied through ``baseline_from`` has no checkpoint in this study's folder:
    the export reads the source study's (the same key's folder beside the store it was copied
    from) and says where it came from; with that checkpoint gone, the refusal names the study."""
    p, out, _ = study
    src = load_study(p, output=out)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    reuser = tmp_path / "reuser.yaml"
    reuser.write_text(
        STUDY.replace("name: exporttest", "name: reuser").replace("[wgrad]", "[fprop]")
        + "baseline: {fp4_gemms: []}\n"
        + f"baseline_from: {{uri: '{uri}', name: exporttest}}\n"
    )
    mine = tmp_path / "mine"
    s = load_study(reuser, output=mine)
    run_study(s, executor="local", progress=False)
    base = s.baseline_cells[0]
    assert not s.checkpoint_dir(base).exists()  # copied, not trained here
    args = ["export", str(reuser), "--output", str(mine), "--cell", base.label]
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "reused")])
    assert res.exit_code == 0, res.output
    theirs = export_cell(src, base.key, tmp_path / "theirs")
    assert (tmp_path / "reused" / "model.safetensors").read_bytes() == (
        theirs / "model.safetensors"
    ).read_bytes()
    meta = json.loads((tmp_path / "reused" / "ablate_export.json").read_text())
    assert meta["study"] == "reuser" and meta["reused_from"] == f"study exporttest in {uri}"
    # the source's checkpoint moved away: refused, naming the study the seed came from
    ckpt = src.checkpoint_dir(base)
    ckpt.rename(tmp_path / "aside")
    try:
        res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "none")])
    finally:
        (tmp_path / "aside").rename(ckpt)
    assert res.exit_code == 2, res.output
    assert f"is a baseline seed reused from study exporttest in {uri}" in res.output
    assert str(ckpt) in res.output and not (tmp_path / "none").exists()
