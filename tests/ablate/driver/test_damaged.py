"""A cell's checkpoint files damaged between two runs of a study (they are read as untrusted): a
sidecar that is not JSON, or JSON that is not a sidecar, counts as none, ``plan`` says the step the
cell resumes from as ``run`` then resumes it; a damaged checkpoint is set aside, kept, and the cell
trains from step 0, as ``plan`` says (one damaged inside only a load finds, which ``plan`` leaves
to the run), its run recording that the attempt started from step 0; a checkpoint missing behind
its sidecar is none: the cell trains from step 0, nothing set aside, as ``plan`` says; either way
the store holds every step once. A poisoned checkpoint (one that could run code) fails its cell, saying how to
train it again."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from test_runner import assert_store_holds, tiny_study
from test_untrusted import Payload

from ablate.driver.branching import cost
from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.study import Study
from ablate.train.checkpoint import CHECKPOINT, load_file


def interrupted(tmp_path: Path) -> tuple[Study, Path]:
    """A one-cell study of 9 steps stopped after 4 (checkpointed at step 4), and its folder."""
    s = tiny_study(tmp_path, steps=9, fp4_gemms=[[]], seed=[0])
    first = run_study(s, executor="local", progress=False, stop_after=4, stream=io.StringIO())
    assert [o.status for o in first.outcomes.values()] == ["interrupted"]
    ck = s.checkpoint_dir(s.cells[0])
    assert load_file(ck / CHECKPOINT)["state"]["step"] == 4
    return s, ck


def resumed_from(s: Study, run_id: str) -> str:
    """The step the cell's last attempt started from, as its run records it."""
    return MlflowClient(s.tracking_uri).get_run(run_id).data.tags["ablate.resumed_from"]


@pytest.mark.parametrize("sidecar", ["{not json", "[]", '{"step": "abc"}', '{"step": true}'])
def test_a_damaged_sidecar_resumes_from_the_checkpoint_as_plan_says(tmp_path, sidecar):
    s, ck = interrupted(tmp_path)
    (ck / "checkpoint.json").write_text(sidecar)
    assert [p.why for p in plan(s)] == ["interrupted; from the step-4 checkpoint"]
    again = run_study(s, executor="local", progress=False, stream=io.StringIO())
    assert [o.status for o in again.outcomes.values()] == ["finished"]
    ids = assert_store_holds(s, expect_steps=9)
    assert resumed_from(s, ids[s.cells[0].key]) == "4"


def test_a_damaged_checkpoint_is_set_aside_and_the_cell_trains_from_step_0(tmp_path):
    s, ck = interrupted(tmp_path)
    raw = (ck / CHECKPOINT).read_bytes()
    (ck / CHECKPOINT).write_bytes(raw[:5000])  # `truncate -s 5000`
    # its sidecar is sound, but plan reads the file's zip directory: none, so what run will do
    assert json.loads((ck / "checkpoint.json").read_text())["step"] == 4
    why = "interrupted; from step 0, its damaged step-4 checkpoint set aside (kept)"
    assert [p.why for p in plan(s)] == [why]
    with pytest.warns(RuntimeWarning, match=rf"{re.escape(str(ck / CHECKPOINT))}: damaged.*step 0"):
        again = run_study(s, executor="local", progress=False, stream=io.StringIO())
    assert [o.status for o in again.outcomes.values()] == ["finished"]
    (aside,) = ck.parent.glob(f"{ck.name}.damaged-*")  # kept as it was, its sidecar with it
    assert (aside / CHECKPOINT).read_bytes() == raw[:5000]
    assert json.loads((aside / "checkpoint.json").read_text())["step"] == 4
    # every step once; the points the first attempt logged are those the cell computed again
    ids = assert_store_holds(s, expect_steps=9)
    logged = MlflowClient(s.tracking_uri).get_metric_history(ids[s.cells[0].key], "val_loss")
    evals = load_file(ck / CHECKPOINT)["state"]["evals"]
    assert sorted((m.step, m.value) for m in logged) == [(e["step"], e["val_loss"]) for e in evals]
    assert resumed_from(s, ids[s.cells[0].key]) == "0"  # not the sidecar's 4


def test_a_checkpoint_damaged_inside_is_set_aside_and_its_run_says_it_started_at_0(tmp_path):
    """Its pickle garbled behind a sound zip directory: only a load finds it, so ``plan`` says
    step 4, but the attempt's recorded start is the step it trained from."""
    s, ck = interrupted(tmp_path)
    sound = ck.parent / "sound.pt"
    (ck / CHECKPOINT).rename(sound)
    with zipfile.ZipFile(sound) as src, zipfile.ZipFile(ck / CHECKPOINT, "w") as dst:
        for i in src.infolist():
            data = src.read(i)
            dst.writestr(i, b"\0" * len(data) if i.filename.endswith("/data.pkl") else data)
    assert [p.why for p in plan(s)] == ["interrupted; from the step-4 checkpoint"]
    with pytest.warns(RuntimeWarning, match=r"damaged or not a checkpoint file.*step 0"):
        again = run_study(s, executor="local", progress=False, stream=io.StringIO())
    assert [o.status for o in again.outcomes.values()] == ["finished"]
    assert len(list(ck.parent.glob(f"{ck.name}.damaged-*"))) == 1
    ids = assert_store_holds(s, expect_steps=9)
    assert resumed_from(s, ids[s.cells[0].key]) == "0"


def test_a_checkpoint_missing_behind_its_sidecar_is_none_and_plan_says_so(tmp_path):
    s, ck = interrupted(tmp_path)
    (ck / CHECKPOINT).unlink()  # its sidecar names step 4
    assert json.loads((ck / "checkpoint.json").read_text())["step"] == 4
    why = "interrupted; from step 0, its step-4 checkpoint missing (no checkpoint.pt)"
    assert [p.why for p in plan(s)] == [why]
    assert cost(s, plan(s)) == (9, 9)  # every step trained again
    again = run_study(s, executor="local", progress=False, stream=io.StringIO())
    assert [o.status for o in again.outcomes.values()] == ["finished"]
    assert not list(ck.parent.glob(f"{ck.name}.*"))  # nothing set aside
    assert json.loads((ck / "checkpoint.json").read_text())["step"] == 9  # its own now
    ids = assert_store_holds(s, expect_steps=9)
    assert resumed_from(s, ids[s.cells[0].key]) == "0"


def test_a_poisoned_checkpoint_fails_its_cell_saying_how_to_train_it_again(tmp_path):
    """Refused unread (it could run code), never set aside by ablate: the cell fails with one
    line that names the file and says what to do; done so, the cell trains from step 0."""
    s, ck = interrupted(tmp_path)
    marker = tmp_path / "ran"
    torch.save({**load_file(ck / CHECKPOINT), "extra": Payload(marker)}, ck / CHECKPOINT)
    first = run_study(s, executor="local", progress=False, stream=io.StringIO())
    (o,) = first.outcomes.values()
    assert o.status == "failed" and "\n" not in o.reason
    assert o.reason.startswith(f"CheckpointError: {ck / CHECKPOINT}: refused, not loaded")
    assert "could run code" in o.reason and o.reason.endswith(
        f"; ablate will not load it: to train the cell from step 0, move its checkpoint folder "
        f"aside (kept: `mv {ck} {ck}.refused`) and run it again (`ablate run --rerun-failed`)"
    )
    ck.rename(f"{ck}.refused")  # as it says
    again = run_study(s, executor="local", progress=False, rerun_failed=True, stream=io.StringIO())
    assert [o.status for o in again.outcomes.values()] == ["finished"]
    assert_store_holds(s, expect_steps=9)
    assert not marker.exists()
