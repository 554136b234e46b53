"""The study: expansion, keys, labels, and errors that name the YAML path and the allowed values."""

import re
from pathlib import Path

import pytest
import yaml

from ablate.errors import StudyError
from ablate.study import json_schema, load_study, parse_study
from ablate.study.loader import parse_yaml

ROOT = Path(__file__).resolve().parents[3]

BASE = {"name": "t", "base": {"train": {"steps": 5, "batch_size": 4, "eval_every": 5}}}


def study(**kw):
    return parse_study({**BASE, **kw})


def errors_of(**kw) -> list[str]:
    with pytest.raises(StudyError) as e:
        parse_study({**BASE, **kw})
    return e.value.errors


def test_grid_is_the_product_minus_exclusions():
    s = study(
        grid={
            "fp4_gemms": [[], ["fprop"], ["fprop", "dgrad", "wgrad"]],
            "intervention": ["none", "sr", "dht"],
            "seed": [0, 1],
        },
        exclude=[{"fp4_gemms": [], "intervention": ["sr", "dht"]}],
        baseline={"fp4_gemms": []},
    )
    assert len(s.cells) == (3 * 3 - 2) * 2
    assert s.axes == ["fp4_gemms", "intervention", "seed"]
    assert [c.label for c in s.baseline_cells] == ["bf16/seed0", "bf16/seed1"]
    labels = {c.label for c in s.cells}
    assert "mxfp4[fprop,dgrad,wgrad]+dht16/bf16/seed1" in labels
    assert "mxfp4[fprop]+sr/bf16/seed0" in labels


def test_cells_differing_only_by_seed_share_a_config_label():
    s = study(grid={"fp4_gemms": [["wgrad"]], "seed": [0, 1, 2]})
    assert {c.config_label for c in s.cells} == {"mxfp4[wgrad]/bf16"}
    assert [c.seed for c in s.cells] == [0, 1, 2]
    assert len({c.key for c in s.cells}) == 3


def test_union_of_grids_and_zip():
    s = study(
        grid=[
            {"base_format": ["bf16", "fp8"]},
            {"zip": {"model.preset": ["tiny", "small"], "train.lr": [2e-3, 1e-3]}},
        ]
    )
    assert len(s.cells) == 4
    got = {(c.config.model.preset, c.config.train.lr) for c in s.cells}
    assert ("small", 1e-3) in got and ("tiny", 2e-3) in got and ("small", 2e-3) not in got


def test_dotted_axes_label_as_leaf_values():
    s = study(grid={"train.lr": [1e-3, 3e-3]})
    assert [c.label for c in s.cells] == ["lr=0.001", "lr=0.003"]


def test_key_is_independent_of_yaml_key_order_and_spelling():
    a = yaml.safe_load(
        "name: t\nbase: {train: {steps: 5, lr: 0.003}, model: {preset: tiny}}\n"
        "grid: {fp4_gemms: [[dgrad, fprop]], seed: [1]}"
    )
    b = yaml.safe_load(
        "grid: {seed: [1], fp4_gemms: [[fprop, dgrad]]}\n"
        "base: {model: {preset: tiny}, train: {lr: 3.0e-3, steps: 5}}\nname: other"
    )
    assert parse_study(a).cells[0].key == parse_study(b).cells[0].key


def test_a_changed_config_gets_a_new_key():
    k1 = study(grid={"seed": [0]}).cells[0].key
    s2 = parse_study(
        {**BASE, "base": {"train": {"steps": 6, "batch_size": 4}}, "grid": {"seed": [0]}}
    )
    assert s2.cells[0].key != k1


def test_checkpoints_default_to_every_evaluation():
    assert study(grid={"seed": [0]}).cells[0].config.train.checkpoint_every == 5
    s = parse_study(
        {"name": "t", "base": {"train": {"checkpoint_every": 0, "steps": 5}}, "grid": {"seed": [0]}}
    )
    assert s.cells[0].config.train.checkpoint_every == 0


def test_duplicate_cells_run_once():
    s = study(grid=[{"seed": [0, 1]}, {"seed": [1, 2]}])
    assert [c.seed for c in s.cells] == [0, 1, 2]
    assert s.notes


@pytest.mark.parametrize(
    "kw, path, words",
    [
        ({"grid": {"trian.lr": [1]}}, "grid.trian.lr", ["did you mean 'train.lr'", "allowed"]),
        ({"grid": {"train.lrr": [1]}}, "grid.train.lrr", ["did you mean 'lr'", "warmup_steps"]),
        ({"grid": {"bogus": [1]}}, "grid.bogus", ["unknown axis", "intervention"]),
        (
            {"grid": {"fp4_gemms": [["fprop"]], "intervention": ["none", "rth"]}},
            "grid.intervention[1]",
            ["unknown 'rth'", "sr", "rht", "dht"],
        ),
        ({"grid": {}}, "grid", ["empty grid"]),
        ({"grid": {"seed": []}}, "grid.seed", ["empty"]),
        ({"grid": {"seed": 3}}, "grid.seed", ["list of values"]),
        ({"grid": {"train.lr": ["fast"]}}, "grid.train.lr[0]", ["valid number"]),
        ({"grid": {"seed": [-1]}}, "grid.seed[0]", ["greater than or equal to 0"]),
        ({"grid": {"fp4_gemms": [["fprop", "dgrd"]]}}, "grid.fp4_gemms[0][1]", ["'wgrad'"]),
        ({"grid": {"model.preset": ["huge"]}}, "grid.model.preset[0]", ["tiny", "llama3_8b"]),
        ({"grid": {"backend": ["nativ"]}}, "grid.backend[0]", ["allowed: emulated"]),
        ({"grid": {"fp4_format": ["mxfp3"]}}, "grid.fp4_format[0]", ["'mxfp4'", "'nvfp4'"]),
        ({"grid": {"train.grad_accum": [3]}}, "grid.train.grad_accum[0]", ["does not divide"]),
        ({"grid": {"seed": [0]}, "baseline": {"seed": 5}}, "baseline", ["matches no cell"]),
        (
            {"grid": {"seed": [0]}, "baseline": {"fp4_gemms": []}},
            "baseline.fp4_gemms",
            ["axes: seed"],
        ),
        ({"grid": {"seed": [0]}, "exclude": [{"seed": 4}]}, "exclude[0]", ["matches no cell"]),
        ({"grid": {"seed": [0]}, "exclude": [{"seed": 0}]}, "exclude", ["every cell"]),
        ({"grid": {"seed": [0]}, "grd": 1}, "grd", ["did you mean 'grid'", "allowed: name"]),
        (
            {"grid": {"seed": [0]}, "target": {"val_ppl": 3, "val_loss": 1}},
            "target",
            ["exactly one"],
        ),
        (
            {"grid": {"seed": [0]}, "resources": {"gpu": 1}},
            "resources.gpu",
            ["allowed: cpus, gpus"],
        ),
        ({"grid": {"zip": {"seed": [0, 1], "train.lr": [1]}}}, "grid.zip", ["equal lengths"]),
        ({"grid": {"seed": [0]}, "name": "a b"}, "name", ["letters, digits"]),
        ({"grid": {"seed": [0]}, "probe": {"evry": 5}}, "probe.evry", ["did you mean 'every'"]),
        ({"grid": {"seed": [0]}, "probe": {"every": 0}}, "probe.every", ["must be >= 1"]),
        (
            {"grid": {"seed": [0]}, "probe": {"gemms": ["wgard"]}},
            "probe.gemms[0]",
            ["'fprop'", "'wgrad'"],
        ),
        (
            {"grid": {"seed": [0]}, "probe": {"layers": "first"}},
            "probe.layers",
            ["neither all nor a list of block indices"],
        ),
        ({"grid": {"seed": [0]}, "probe": {"layers": [0, -2]}}, "probe.layers[1]", ["block index"]),
        (
            {"grid": {"seed": [0]}, "probe": {"layers": [1, 7]}},
            "probe.layers[1]",
            ["block 7 does not exist", "4 blocks (0-3)"],
        ),
        (
            {"grid": {"seed": [0]}, "probe": {"batches": 1000}},
            "probe.batches",
            ["data.val_tokens >=", "lower probe.batches"],
        ),
        ({"grid": {"seed": [0]}, "probe": {"window": 1}}, "probe.window", [">= 2"]),
        (
            {"grid": {"seed": [0]}, "baseline": {"seed": 0}, "baseline_extend": 0},
            "baseline_extend",
            ["0 is not in (0, 4]", "fraction of train.steps"],
        ),
        (
            {"grid": {"seed": [0]}, "baseline": {"seed": 0}, "baseline_extend": "long"},
            "baseline_extend",
            ["long is not in (0, 4]"],
        ),
        ({"grid": {"seed": [0]}, "baseline_extend": 0.5}, "baseline_extend", ["no baseline"]),
        (
            {
                "grid": {"seed": [0]},
                "base": {"train": {"steps": 5, "schedule_steps": 4}},
                "baseline": {"seed": 0},
                "baseline_extend": 0.5,
            },
            "baseline_extend",
            ["set train.schedule_steps themselves"],
        ),
    ],
)
def test_bad_studies_name_the_yaml_path_and_what_is_allowed(kw, path, words):
    errs = errors_of(**kw)
    hit = [e for e in errs if e.startswith(path + ":")]
    assert hit, errs
    for w in words:
        assert any(w in e for e in hit), (w, hit)


def test_base_errors_name_the_base_path():
    with pytest.raises(StudyError) as e:
        parse_study(
            {"name": "t", "base": {"train": {"stepz": 3, "grad_accum": 3}}, "grid": {"seed": [0]}}
        )
    assert any(
        x.startswith("base.train.stepz: unknown key (did you mean 'steps'?)")
        for x in e.value.errors
    )
    with pytest.raises(StudyError) as e:
        parse_study({"name": "t", "base": {"train": {"grad_accum": 3}}, "grid": {"seed": [0]}})
    assert e.value.errors[0].startswith("base.train.grad_accum: 3 does not divide")


def test_impossible_combinations_point_at_exclude():
    errs = errors_of(grid={"fp4_gemms": [[], ["fprop"]], "intervention": ["none", "sr"]})
    assert len(errs) == 1
    assert errs[0].startswith("cell {fp4_gemms: [], intervention: sr}:")
    assert "exclude" in errs[0]


def test_missing_data_file_is_an_error_before_anything_runs(tmp_path):
    errs = errors_of(
        base={"data": {"corpus": "text", "path": str(tmp_path / "none" / "*.txt")}},
        grid={"seed": [0]},
    )
    assert errs[0].startswith("base.data.path: no files match")


def test_yaml_syntax_errors_and_missing_files(tmp_path):
    with pytest.raises(StudyError, match="no such study file"):
        load_study(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngrid: {seed: [0\n")
    with pytest.raises(StudyError, match="not valid YAML"):
        load_study(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(StudyError, match="must be a mapping"):
        load_study(bad)


def test_a_study_path_that_is_no_regular_file_is_named_as_such(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.yaml")  # never opened: a read would wait for a writer
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    cases = {
        "/dev/zero": "the study file is not a regular file (a character device)",
        tmp_path / "pipe.yaml": "the study file is not a regular file (a named pipe)",
        tmp_path / "loop.yaml": "the study file is a symbolic link loop",
        tmp_path: "the study file is not a regular file (a directory)",
        tmp_path / "nope.yaml": "no such study file",
    }
    for path, says in cases.items():
        with pytest.raises(StudyError) as e:
            load_study(path)
        assert e.value.errors == [f"{path}: {says}"]


def test_a_long_unknown_key_is_named_shortened():
    long = "k" * 2000
    cut = "k" * 57 + "..."
    assert errors_of(**{long: 1}, grid={"seed": [0]})[0].startswith(f"{cut}: unknown key")
    (err,) = errors_of(base={"train": {long: 1}}, grid={"seed": [0]})
    assert err.startswith(f"base.train.{cut}: unknown key") and len(err) < 600
    (err,) = errors_of(grid={"seed": [0], long: [1]})
    assert err.startswith(f"grid.{cut}: unknown axis '{cut}'") and len(err) < 600
    (err,) = errors_of(grid={"seed": [0], f"train.{long}": [1]})
    assert f"train has no field '{cut}'" in err and len(err) < 900
    # a long key given twice is cut the same way (an explicit key: a plain one is at most 1024)
    with pytest.raises(StudyError, match=re.escape(f"the key '{cut}' is given twice")):
        parse_yaml(f"? {long}\n: 1\n? {long}\n: 2\n")


MERGED = """\
name: merged
base:
  model: {preset: tiny}
  train: {steps: 5, batch_size: 4, eval_every: 5}
grid:
  - fp4_gemms: [[]]
  - &full
    fp4_gemms: [[fprop, dgrad, wgrad]]
    intervention: [sr, dht]
  - <<: *full
    intervention: [none]
    scale_mode: [ceil, even]
  - {<<: [{fp4_gemms: [[fprop]], scale_mode: [even]}, *full, {scale_mode: [ceil]}]}
baseline: {fp4_gemms: []}
"""
WRITTEN_OUT = """\
name: merged
base:
  model: {preset: tiny}
  train: {steps: 5, batch_size: 4, eval_every: 5}
grid:
  - fp4_gemms: [[]]
  - fp4_gemms: [[fprop, dgrad, wgrad]]
    intervention: [sr, dht]
  - fp4_gemms: [[fprop, dgrad, wgrad]]
    intervention: [none]
    scale_mode: [ceil, even]
  - {fp4_gemms: [[fprop]], scale_mode: [even], intervention: [sr, dht]}
baseline: {fp4_gemms: []}
"""


def test_yaml_merge_keys_give_the_study_written_out(tmp_path):
    # a key written beside a merged one overrides it; of merged mappings, the earlier wins
    (tmp_path / "merged.yaml").write_text(MERGED)
    (tmp_path / "written.yaml").write_text(WRITTEN_OUT)
    merged, written = load_study(tmp_path / "merged.yaml"), load_study(tmp_path / "written.yaml")
    assert [c.key for c in merged.cells] == [c.key for c in written.cells]
    assert [c.label for c in merged.cells] == [c.label for c in written.cells]
    assert len(merged.cells) == 7
    # merged in turn: the override made in the merged mapping holds
    nested = "a: &a {x: 1, y: 2}\nb: &b {<<: *a, x: 3}\nc: {<<: *b, z: 4}\n"
    assert parse_yaml(nested)["c"] == {"x": 3, "y": 2, "z": 4}
    twice = MERGED.replace("    scale_mode: [ceil, even]\n", "    scale_mode: [ceil]\n" * 2)
    (tmp_path / "twice.yaml").write_text(twice)
    with pytest.raises(StudyError, match="the key 'scale_mode' is given twice"):
        load_study(tmp_path / "twice.yaml")
    with pytest.raises(StudyError, match="the key '<<' is given twice") as e:
        parse_yaml("a: &a {x: 1}\nb: {<<: *a, <<: *a}\n")
    # keeping one of the two would drop a merged mapping: the message says to write a list
    assert "write one merge key with a list: <<: [*a, *b]" in str(e.value)
    assert "keep one" not in str(e.value)
    with pytest.raises(StudyError, match=r"a list of mappings to merge \(<<\), found scalar"):
        parse_yaml("a: {<<: 3}\n")


@pytest.mark.parametrize(
    "text",
    [
        "x: {<<: {k: 1,\n  k: 2}}\n",  # merged, never constructed on its own
        "x: {<<: &base {k: 1,\n  k: 2}}\n",  # anchored inline, still only merged
        "x: {<<: [{j: 0}, {k: 1,\n  k: 2}]}\n",  # one of a list
        "a: &a {k: 1,\n  k: 2}\nb: {<<: *a}\n",  # constructed and merged: refused once
    ],
)
def test_a_key_given_twice_in_a_merged_mapping_is_refused(text):
    with pytest.raises(StudyError, match=r"the key 'k' is given twice \(line 1 and line 2\)"):
        parse_yaml(text)


@pytest.mark.parametrize(
    "name", ["quickstart", "mxfp4_wgrad", "tseng_sr_rht", "recipes", "recipes_gpu", "probes"]
)
def test_shipped_studies_are_valid(name):
    s = load_study(ROOT / "studies" / f"{name}.yaml")
    assert s.name == name
    assert len(s.baseline_cells) >= 2
    assert len({c.key for c in s.cells}) == len(s.cells)


def test_a_study_whose_hub_tokenizer_cannot_be_had_is_refused_offline(monkeypatch, tmp_path):
    from ablate.driver.preflight import check_hub
    from ablate.errors import CannotRunError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network is tried
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    s = load_study(ROOT / "studies" / "recipes_gpu.yaml")
    with pytest.raises(CannotRunError, match=r"data.tokenizer: 'meta-llama/Llama-3.1-8B' is not"):
        check_hub(s)


def test_published_grids_have_the_papers_cells():
    s = load_study(ROOT / "studies" / "mxfp4_wgrad.yaml")
    configs = {c.config_label for c in s.cells}
    assert configs == {
        "fp8",
        "mxfp4[fprop]/fp8",
        "mxfp4[fprop,dgrad]/fp8",
        "mxfp4[fprop,dgrad,wgrad]/fp8",
        "mxfp4[fprop,dgrad,wgrad]+sr/fp8",
        "mxfp4[fprop,dgrad,wgrad]+rht16/fp8",
        "mxfp4[fprop,dgrad,wgrad]+dht16/fp8",
    }
    assert {c.seed for c in s.cells} == {0, 1, 2}
    t = load_study(ROOT / "studies" / "tseng_sr_rht.yaml")
    cell = next(c for c in t.cells if c.config_label == "mxfp4[dgrad,wgrad]+sr+rht64/bf16")
    r = cell.config.recipe
    assert r.fprop.high_precision
    for g in (r.dgrad, r.wgrad):
        assert g.hadamard is not None and g.hadamard.size == 64 and g.hadamard.signs == "random"
        assert g.a is not None and g.a.rounding == "sr" and g.a.format == "mxfp4"


def test_quickstart_decides_the_interventions_in_waves():
    s = load_study(ROOT / "studies" / "quickstart.yaml")
    assert {c.config_label for c in s.cells} == {
        "fp8",
        "mxfp4[fprop,dgrad,wgrad]+sr/fp8",
        "mxfp4[fprop,dgrad,wgrad]+dht16/fp8",
    }
    assert {c.seed for c in s.cells} == set(range(6))  # every seed the waves may ask for
    plan = s.sequential
    assert plan is not None and plan.looks() == [4, 6] and plan.margin == 0.05
    assert s.file.target.val_ppl == 17.7


def test_json_schema_describes_the_study():
    sch = json_schema()
    assert {"name", "base", "grid", "exclude", "baseline", "target"} <= set(sch["properties"])
    assert sch["additionalProperties"] is False


def test_probes_are_off_by_default_reach_every_cell_and_leave_keys_alone():
    grid = {"fp4_gemms": [[], ["wgrad"]], "seed": [0, 1]}
    plain = study(grid=grid)
    assert all(c.config.probe is None for c in plain.cells)
    probed = study(grid=grid, probe={"every": 5, "gemms": ["wgrad", "dgrad"], "layers": [0, 3]})
    assert [c.key for c in probed.cells] == [c.key for c in plain.cells]
    for c in probed.cells:
        assert c.config.probe is not None and c.config.probe.every == 5
        assert c.config.probe.layers == [0, 3] and c.config.probe.gemms == ["wgrad", "dgrad"]
        assert c.config.to_dict()["probe"]["every"] == 5  # what a Ray task carries
    d = study(grid=grid, probe={}).cells[0].config.probe
    assert d is not None and (d.every, d.batches, d.gemms, d.layers, d.repeats, d.window) == (
        10, 1, ["wgrad"], "all", 2, 4
    )  # fmt: skip


def test_scale_mode_as_an_axis_gives_each_cell_its_own_label():
    # it used to collide (the label ignored the scale mode) and validation refused the study
    study = parse_study(
        {
            "name": "sm",
            "base": {"model": {"preset": "tiny"}, "fp4_gemms": ["fprop"]},
            "grid": {"scale_mode": ["floor", "ceil"], "seed": [0]},
        }
    )
    labels = [c.label for c in study.cells]
    assert labels == ["mxfp4[fprop]/bf16/scale_mode=floor", "mxfp4[fprop]/bf16/scale_mode=ceil"]


def test_baseline_extend_trains_the_baseline_on_past_the_budget_under_its_own_keys():
    grid = {"fp4_gemms": [[], ["fprop"]], "seed": [0, 1]}
    plain = study(grid=grid, baseline={"fp4_gemms": []})
    longer = study(grid=grid, baseline={"fp4_gemms": []}, baseline_extend=0.5)
    keys = {c.label: c.key for c in plain.cells}
    for c in longer.cells:
        t = c.config.train
        if c.baseline:  # 5 steps on the schedule, then ceil(2.5) = 3 more at its final rate
            assert (t.steps, t.schedule_steps, c.extra_steps) == (8, 5, 3)
            assert c.key != keys[c.label] and "3 past the budget of 5" in c.role
        else:  # every other cell is the cell it was: same config, same key, same results
            assert (t.steps, t.schedule_steps, c.extra_steps) == (5, None, 0)
            assert c.key == keys[c.label] and c.role == "baseline"
    assert "trains 8 steps, 1.60x the budget of 5" in (longer.extension_note or "")
    assert plain.extension_note is None


def test_an_error_in_every_cell_is_said_once_and_a_combinations_error_names_its_cell(tmp_path):
    base = {"device": "cpu", "model": {"preset": "tiny"}, "data": {"val_tokens": 4096}}
    every = {"name": "s", "base": base | {"train": {"seq_len": 512}}, "grid": {"seed": [0, 1]}}
    with pytest.raises(StudyError) as e:
        parse_study(every, output=tmp_path)
    assert e.value.errors == [
        "train.seq_len: 512 is longer than the model supports (model.max_seq_len = 256); shorten "
        "it or raise model.max_seq_len (in every cell)"
    ]
    some = {"name": "s", "base": base, "grid": {"train.seq_len": [128, 512]}}
    with pytest.raises(StudyError) as e:
        parse_study(some, output=tmp_path)
    assert len(e.value.errors) == 1
    assert e.value.errors[0].startswith("cell {train.seq_len: 512}: train.seq_len: 512 is longer")
    assert e.value.errors[0].endswith("drop impossible cells with `exclude`")


def test_a_zip_that_is_not_a_mapping_is_refused_at_its_path():
    assert errors_of(grid={"zip": 5}) == [
        "grid.zip: must map axes to equal-length lists, e.g. {train.lr: [..], ...}"
    ]
    assert errors_of(grid={"zip": [5, {"seed": [0]}]})[0].startswith("grid.zip[0]: must map")


def test_what_the_study_sets_on_a_cell_is_validated_with_its_config():
    # resources.gpus makes the device cuda, where train.compile: auto compiles, which FSDP2's bf16
    # all-gather cannot trace: refused here, not by the worker that reads the config back
    errors = errors_of(
        base={
            "train": {
                "steps": 4,
                "batch_size": 4,
                "eval_every": 2,
                "precision": "bf16",
                "parallel": "fsdp",
                "fsdp_all_gather": "bf16",
            }
        },
        resources={"workers": 2, "gpus": 1},
        grid={"seed": [0, 1]},
    )
    assert errors == [
        "train.fsdp_all_gather: bf16 makes each block linear an FSDP2 unit, whose hooks a compiled "
        "block cannot trace (train.compile: auto on cuda); set train.compile: false, or "
        "fsdp_all_gather: fp32 (in every cell)"
    ]
    s = study(
        base={"train": {"steps": 4, "batch_size": 4, "eval_every": 2}},
        resources={"gpus": 1},
        grid={"seed": [0]},
    )
    c = s.cells[0].config
    assert (c.device, c.train.checkpoint_every) == ("cuda", 2)  # the study's defaults, applied
