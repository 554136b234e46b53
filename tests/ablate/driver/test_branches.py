"""Decay branches in a study (``ablate.study.families``, ``ablate.driver.branching``): budgets 8, 12
and 16 of one wsd configuration run as one trunk and two decays, on real MLflow (SQLite under
tmp_path) and the in-process executor; every recorded number and the final weights equal those of
each budget trained from step 0 (the trunk's: those of a run that saves no branch checkpoint),
interrupted runs included; a re-run skips everything; ``plan`` shows the family and counts the
steps trained; a branch whose checkpoint only a load finds damaged copies none of its trunk's
curve."""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.driver import branching
from ablate.driver.planning import PlannedCell, plan
from ablate.driver.runner import run_study
from ablate.executor.task import Task
from ablate.executor.worker import run_one
from ablate.study import Study, parse_study
from ablate.study.families import branch_root, families
from ablate.tracking import StudyTracker, prepare_store
from ablate.train.checkpoint import CHECKPOINT, load_file

BUDGETS = [8, 12, 16]  # decays of 2, 2, 3 steps: branch points 6 (an evaluation) and 10
TIMING = {"tokens_per_s"}  # wall-clock: the one metric that may differ


def raw(name: str, steps: list[int]) -> dict:
    return {
        "name": name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 2048},
            "train": {
                "batch_size": 4, "seq_len": 32, "warmup_steps": 2, "eval_every": 3,
                "eval_batches": 1, "schedule": "wsd",
            },
            "fp4_gemms": ["wgrad"],
            "intervention": "sr",  # stochastic rounding: the random streams must match too
        },
        "grid": {"train.steps": steps},
        "resources": {"cpus": 1},
    }  # fmt: skip


def study(tmp_path: Path, name: str, steps: list[int]) -> Study:
    """The study ``name`` in its own output folder; every study of a test shares one MLflow store
    (a new store's schema migrations cost seconds)."""
    spec = raw(name, steps) | {"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    return parse_study(spec, output=tmp_path / name, text="# test\n")


def run(s: Study, **kw):
    return run_study(s, executor="local", progress=False, stream=io.StringIO(), **kw)


def recorded(s: Study) -> dict[str, tuple[dict[str, list[tuple[int, float]]], dict[str, str]]]:
    """Each cell's metric histories (every metric, every step) and tags, by key."""
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name(s.name)
    out = {}
    for r in client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'cell'"):
        series = {
            k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
            for k in r.data.metrics
            if k not in TIMING
        }
        out[r.data.tags["ablate.key"]] = (series, r.data.tags | {"run_id": r.info.run_id})
    return out


def weights(s: Study, key: str) -> dict[str, torch.Tensor]:
    return load_file(s.output_dir / "cells" / key / CHECKPOINT)["model"]


@pytest.mark.slow
def test_decay_branches_of_a_study_equal_each_budget_trained_directly(tmp_path):
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    assert family.trunk.config.train.steps == 16 and family.points == (6, 10)
    # interrupted at step 11: the trunk (having saved steps 6 and 10) and the 12-step branch
    # (started at 10); the 8-step branch (started at 6) finishes
    first = run(ladder, stop_after=11)
    assert sorted(o.status for o in first.outcomes.values()) == [
        "finished",
        "interrupted",
        "interrupted",
    ]
    assert [p.action for p in plan(ladder)].count("resume") == 2
    root = branch_root(ladder.output_dir, family.key)
    assert [d.name for d in root.iterdir()] == ["step-000000010"]  # step 6's branch is done
    second = run(ladder)  # both resume from their own checkpoints
    assert sorted(o.status for o in second.outcomes.values()) == ["finished", "finished"]
    trained = {k: o.steps for k, o in second.outcomes.items()}
    assert trained == {family.trunk.key: 16, family.branches[1][0].key: 12}
    assert not any(root.iterdir())  # every branch has its result: no branch checkpoint is kept
    # a re-run skips everything
    assert [p.action for p in plan(ladder)] == ["skip"] * 3
    assert run(ladder).outcomes == {}

    # the same study with every budget trained from step 0
    direct = study(tmp_path, "direct", BUDGETS)
    assert [o.status for o in run(direct, branches=False).outcomes.values()] == ["finished"] * 3
    assert [c.key for c in direct.cells] == [c.key for c in ladder.cells]  # the same keys

    got, want = recorded(ladder), recorded(direct)
    for cell in ladder.cells:
        series, tags = got[cell.key]
        assert series.keys() == want[cell.key][0].keys()
        for name in series:  # train and validation losses, lr, grad norm, tokens: every step
            assert series[name] == want[cell.key][0][name], (cell.label, name)
        a, b = weights(ladder, cell.key), weights(direct, cell.key)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), cell.label
        assert tags["ablate.family"] == family.key
        assert "ablate.family" not in want[cell.key][1]
    trunk_tags = got[family.trunk.key][1]
    assert "ablate.trunk" not in trunk_tags and "ablate.branch_of" not in trunk_tags
    for cell, point in family.branches:  # copied from the trunk's run up to the branch point
        tags = got[cell.key][1]
        assert tags["ablate.trunk"] == family.trunk.key
        assert tags["ablate.branch_point"] == tags["ablate.branch_step"] == str(point)
        assert tags["ablate.branch_of"] == trunk_tags["run_id"]


def test_plan_shows_the_family_and_counts_the_steps_trained(tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump(raw("ladder", BUDGETS)))
    res = CliRunner().invoke(main, ["plan", str(path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    (family,) = families(study(tmp_path, "out", BUDGETS).cells)
    trunk = family.trunk.key
    assert "trunk of 2 decay branches: checkpoints at steps 6, 10" in res.output
    assert f"decay branch of {trunk} from step 6" in res.output
    assert f"decay branch of {trunk} from step 10" in res.output
    # one run of 16 steps and decays of 2 and 2, not 8 + 12 + 16
    assert (
        "train 20 steps (trunks, then each branch from its branch point), 36 without" in res.output
    )
    res = CliRunner().invoke(main, ["plan", str(path), "-o", str(tmp_path / "out"), "--json"])
    doc = json.loads(res.output)
    assert (doc["steps_to_train"], doc["budget_steps"]) == (20, 36)
    rows = {r["key"]: r for r in doc["cells"]}
    assert rows[trunk]["trunk"] is None and rows[trunk]["starts_at"] == 0
    for cell, point in family.branches:
        assert (
            rows[cell.key] | {"trunk": trunk, "branch_point": point, "starts_at": point}
            == (rows[cell.key])
        )
    assert not (tmp_path / "out").exists()  # plan writes nothing


def test_a_branch_whose_trunk_does_not_pass_its_point_is_planned_from_step_0(tmp_path):
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    (cell, point), trunk = family.branches[0], family.trunk
    ms = branching.members(ladder)
    branch = PlannedCell(cell, "run")
    for trunk_action, start in (("run", point), ("skip", 0), ("failed", 0)):
        planned = {cell.key: branch, trunk.key: PlannedCell(trunk, trunk_action)}  # type: ignore[arg-type]
        assert branching.start_step(ladder, branch, planned, ms[cell.key]) == start
    # with its checkpoint there it starts from it, whatever its trunk does
    where = branch_root(ladder.output_dir, family.key) / f"step-{point:09d}"
    where.mkdir(parents=True)
    torch.save({}, where / CHECKPOINT)  # the file the sidecar names (its zip directory is read)
    (where / "checkpoint.json").write_text(
        json.dumps({"step": point, "status": None, "config_hash": family.key})
    )
    assert branching.start_step(ladder, branch, planned, ms[cell.key]) == point
    assert branching.cost(ladder, [branch, PlannedCell(trunk, "skip")]) == (8 - point, 8)
    # but a stale result rerun from step 0 does not start from a checkpoint older code may have
    # written, unless its trunk writes it anew now
    stale = PlannedCell(cell, "rerun", fresh=True)
    assert branching.start_step(ladder, stale, planned, ms[cell.key]) == 0
    planned[trunk.key] = PlannedCell(trunk, "rerun", fresh=True)
    assert branching.start_step(ladder, stale, planned, ms[cell.key]) == point
    # nor does one whose own checkpoint is damaged: the run sets it aside and trains from step 0
    damaged = PlannedCell(cell, "resume", damaged=f"{where}: damaged")
    assert branching.start_step(ladder, damaged, planned, ms[cell.key]) == 0
    assert branching.cost(ladder, [damaged, PlannedCell(trunk, "skip")]) == (8, 8)
    # a sidecar of its own whose checkpoint.pt is missing names no checkpoint: the run has none
    # there and starts from its branch point, as without one
    own = ladder.checkpoint_dir(cell)
    own.mkdir(parents=True)
    (own / "checkpoint.json").write_text(
        json.dumps({"step": point + 1, "status": None, "config_hash": "h"})
    )
    orphan = PlannedCell(cell, "resume")
    assert branching.own_step(ladder, orphan) == 0
    assert branching.start_step(ladder, orphan, planned, ms[cell.key]) == point
    assert branching.cost(ladder, [orphan, PlannedCell(trunk, "skip")]) == (8 - point, 8)


def test_a_branch_whose_checkpoint_is_damaged_is_planned_from_step_0(tmp_path):
    """Its ``checkpoint.pt`` truncated behind a sound sidecar: not ready, so ``plan``, the gate and
    the worker (which copies the trunk's curve up to where the branch starts) count the branch
    from step 0, as its run trains it (setting the checkpoint aside: test_branch.py)."""
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    (cell, point), trunk = family.branches[0], family.trunk
    b = branching.members(ladder)[cell.key].branches
    b.dir(point).mkdir(parents=True)
    torch.save({"x": torch.zeros(256)}, b.dir(point) / CHECKPOINT)
    (b.dir(point) / "checkpoint.json").write_text(
        json.dumps({"step": point, "status": None, "config_hash": family.key})
    )
    branch, done = PlannedCell(cell, "run"), PlannedCell(trunk, "skip")
    planned = {cell.key: branch, trunk.key: done}
    assert (
        branching.start_step(ladder, branch, planned, branching.members(ladder)[cell.key]) == point
    )
    raw = (b.dir(point) / CHECKPOINT).read_bytes()
    (b.dir(point) / CHECKPOINT).write_bytes(raw[: len(raw) // 2])
    assert not b.ready(point) and b.start is None and b.damage(point)
    assert branching.start_step(ladder, branch, planned, branching.members(ladder)[cell.key]) == 0
    assert branching.cost(ladder, [branch, done]) == (8, 8)
    note = branching.notes(ladder, [branch, done])[cell.key]
    assert note.endswith(": its checkpoint there damaged (set aside): from step 0"), note
    gate = branching.BranchGate()
    gate.hold(Task(cell.key, cell.label, {}, "", "", ""), b, trunk.key)
    assert gate.release({}) == []  # held while its trunk runs: it would save a sound one


def test_a_branch_checkpoint_damaged_inside_copies_no_trunk_curve_and_trains_from_0(tmp_path):
    """Its pickle garbled behind a sound zip directory: ready as the ends of its files show it,
    but its load finds the damage, so the worker asks as the run does before it copies anything:
    no trunk point copied, the branch trains from step 0 (the checkpoint set aside), and its run
    says so (no ``branch_of``, resumed from step 0)."""
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    (cell, point), trunk = family.branches[0], family.trunk
    b = branching.members(ladder)[cell.key].branches
    b.dir(point).mkdir(parents=True)
    buf = io.BytesIO()
    torch.save({"state": {"step": point}, "model": {"w": torch.zeros(64)}}, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(b.dir(point) / CHECKPOINT, "w") as dst:
        for i in src.infolist():
            data = src.read(i)
            dst.writestr(i, b"\0" * len(data) if i.filename.endswith("/data.pkl") else data)
    (b.dir(point) / "checkpoint.json").write_text(
        json.dumps({"step": point, "status": None, "config_hash": family.key})
    )
    assert b.ready(point) and b.start == point  # as `plan` finds it: only a load tells
    prepare_store(ladder.tracking_uri, ladder.output_dir)
    tracker = StudyTracker(ladder.tracking_uri, ladder.name)
    parent = tracker.parent_run("name: ladder\n")
    client = MlflowClient(ladder.tracking_uri)
    trunk_run = tracker.create_cell_run(parent, trunk)
    for step in range(1, point + 1):  # the trunk's curve up to the point: not this branch's
        client.log_metric(trunk_run, "train_loss", 99.0, step=step)
    ckpt = ladder.checkpoint_dir(cell)
    ckpt.parent.mkdir(parents=True)
    cfg = dataclasses.replace(cell.config, checkpoint_dir=str(ckpt))
    run_id = tracker.create_cell_run(parent, cell)
    task = Task(cell.key, cell.label, cfg.to_dict(), ladder.tracking_uri, run_id, str(tmp_path))
    task = dataclasses.replace(task, branches=b.to_dict(), trunk_run=trunk_run)
    with pytest.warns(
        RuntimeWarning, match=rf"{CHECKPOINT}: damaged.*; set aside \(kept\).*step 0"
    ):
        outcome = run_one(task)
    assert outcome.status == "finished", outcome.reason
    losses = client.get_metric_history(run_id, "train_loss")
    assert sorted(m.step for m in losses) == list(range(1, 9))  # its own, every step
    assert 99.0 not in [m.value for m in losses]
    tags = client.get_run(run_id).data.tags
    assert "ablate.branch_of" not in tags and tags["ablate.resumed_from"] == "0"
    assert len(list(b.dir(point).parent.glob(f"{b.dir(point).name}.damaged-*"))) == 1


def test_only_cells_that_differ_in_their_wsd_budget_alone_are_a_family(tmp_path):
    two = parse_study(
        raw("two", BUDGETS) | {"grid": {"train.steps": BUDGETS, "seed": [0, 1]}},
        output=tmp_path / "x",
    )
    assert sorted(len(f.branches) for f in families(two.cells)) == [2, 2]  # one per seed
    cosine = raw("cos", BUDGETS)
    cosine["base"]["train"]["schedule"] = "cosine"
    assert not families(parse_study(cosine, output=tmp_path / "y").cells)
    one = raw("one", [16]) | {"grid": {"train.lr": [1e-3, 3e-3]}}
    assert not families(parse_study(one, output=tmp_path / "z").cells)


def test_the_gate_holds_a_branch_until_its_trunk_saved_its_checkpoint_or_ended(tmp_path):
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    (cell, point), trunk = family.branches[0], family.trunk
    b = family.branches_of(cell, ladder.output_dir)
    task = Task(cell.key, cell.label, {}, "", "", "")
    gate = branching.BranchGate()
    gate.hold(task, b, trunk.key)
    assert gate.release({}) == [] and len(gate) == 1  # the trunk runs, short of the point
    b.dir(point).mkdir(parents=True)
    torch.save({}, b.dir(point) / CHECKPOINT)  # the file the sidecar names, written before it
    (b.dir(point) / "checkpoint.json").write_text(
        json.dumps({"step": point, "status": None, "config_hash": "another family"})
    )
    assert gate.release({}) == []  # not its family's
    (b.dir(point) / "checkpoint.json").write_text(
        json.dumps({"step": point, "status": None, "config_hash": family.key})
    )
    assert gate.release({}) == [task] and len(gate) == 0  # saved: it runs beside the trunk
    gate.hold(task, b, trunk.key)
    assert gate.release({trunk.key}) == [task]  # the trunk ended: it runs, from 0 if need be
    gate.hold(task, b, trunk.key)
    assert gate.release({}, everything=True) == [task]


def test_a_branch_checkpoint_goes_once_every_branch_from_it_has_a_result(tmp_path):
    ladder = study(tmp_path, "ladder", BUDGETS)
    (family,) = families(ladder.cells)
    (short, at6), (middle, at10) = family.branches
    ms = branching.members(ladder)
    dirs = {}
    for cell, point in family.branches:
        dirs[point] = ms[cell.key].branches.dir(point)
        dirs[point].mkdir(parents=True)
        (dirs[point] / "checkpoint.json").write_text("{}")
    gate = branching.BranchGate(ms)
    assert gate.ended(family.trunk.key, "finished") == []  # its branches still need them
    assert gate.ended(short.key, "failed") == []  # it may be rerun
    assert gate.ended(short.key, "finished") == [dirs[at6]]
    assert sorted(p.name for p in dirs[at6].parent.iterdir()) == ["step-000000010"]
    assert gate.ended(middle.key, "diverged") == [dirs[at10]] and not dirs[at10].exists()
    # a branch with its result from an earlier run counts as done
    dirs[at10].mkdir()
    gate = branching.BranchGate(ms, done=[middle.key])
    assert gate.ended(family.trunk.key, "finished") == [dirs[at10]]
