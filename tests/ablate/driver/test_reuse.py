"""Baseline seeds reused from another study's store (``baseline_from``; ``ablate.driver.reuse``),
on real MLflow stores and the in-process executor: ``plan`` shows them, ``run`` copies the seeds
the other store finished (every metric point, params, provenance) instead of training them, trains
the others, writes nothing into the other store, and recopies a copy that a kill cut short (which a
SLURM job counts as work left); the report says where each baseline seed came from; a bad
``baseline_from`` is refused before anything runs, naming the field."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.errors import CannotRunError, StudyError
from ablate.report.provenance import reused_note
from ablate.report.recorded import study_frames
from ablate.slurm.session import SlurmRun, _to_run
from ablate.study import load_study, parse_study
from ablate.tracking import StudyTracker
from ablate.tracking.runs import read_cells
from ablate.tracking.vocab import REUSED_FROM, REUSED_RUN


def raw(name: str, out: Path, seeds: list[int], **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base": {
            "model": {"preset": "tiny"},
            "data": {"val_tokens": 2048},
            "train": {
                "steps": 4, "batch_size": 4, "seq_len": 32, "warmup_steps": 1, "eval_every": 2,
                "eval_batches": 1,
            },
            "base_format": "fp8",
        },
        "grid": [
            {"fp4_gemms": [[]], "seed": seeds},
            {"fp4_gemms": [["wgrad"]], "intervention": ["sr"], "seed": [0]},
        ],
        "baseline": {"fp4_gemms": []},
        "output": str(out / name),
        **over,
    }  # fmt: skip


def run(study):
    return run_study(study, executor="local", progress=False, stream=io.StringIO())


def history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(run_id)
    return {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
        for k in r.data.metrics
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Study ``ref`` run to the end: its FP8 baseline seeds 0 and 1 are results."""
    tmp = tmp_path_factory.mktemp("reuse")
    path = tmp / "ref.yaml"
    path.write_text(yaml.safe_dump(raw("ref", tmp, [0, 1])))
    res = run(load_study(path))
    assert [o.status for o in res.outcomes.values()] == ["finished"] * 3
    return path


def test_a_study_reuses_the_baseline_seeds_another_store_finished(source, tmp_path):
    ref = load_study(source)
    theirs = {c.key: c for c in read_cells(ref.tracking_uri, "ref")}
    spec = raw("new", tmp_path, [0, 1, 2], baseline_from=str(source))
    study = parse_study(spec, text=yaml.safe_dump(spec))
    base = {c.seed: c for c in study.baseline_cells}
    # plan: seeds 0 and 1 reused, seed 2 and the other configuration trained
    actions = {p.cell.key: p.action for p in plan(study)}
    assert [actions[base[s].key] for s in (0, 1, 2)] == ["reuse", "reuse", "run"]
    assert sorted(actions.values()) == ["reuse", "reuse", "run", "run"]
    res = run(study)
    assert sorted(res.outcomes) == sorted(k for k in actions if actions[k] == "run")
    mine = {c.key: c for c in read_cells(study.tracking_uri, "new")}
    for s in (0, 1):
        key = base[s].key
        assert mine[key].status == "finished"
        assert mine[key].tags[REUSED_RUN] == theirs[key].run_id
        assert mine[key].tags[REUSED_FROM] == f"study ref in {ref.tracking_uri}"
        assert history(study.tracking_uri, mine[key].run_id) == history(
            ref.tracking_uri, theirs[key].run_id
        )
        got = MlflowClient(study.tracking_uri).get_run(mine[key].run_id).data
        want = MlflowClient(ref.tracking_uri).get_run(theirs[key].run_id).data
        assert got.params.items() >= {k: v for k, v in want.params.items()}.items()
        assert {k: v for k, v in got.tags.items() if k.startswith("env.")} == {
            k: v for k, v in want.tags.items() if k.startswith("env.")
        }
    assert not mine[base[2].key].reused_from  # trained here
    # the other store is only read
    assert {c.key: c.status for c in read_cells(ref.tracking_uri, "ref")} == {
        k: c.status for k, c in theirs.items()
    }
    # the report says where each baseline seed came from
    cells, _ = study_frames(study)
    note = reused_note(cells)
    assert note is not None and f"seed(s) 0, 1 from study ref in {ref.tracking_uri}" in note
    assert f"(runs {theirs[base[0].key].run_id[:12]}, {theirs[base[1].key].run_id[:12]})" in note
    assert "trained here: seed(s) 2" in note
    # again: nothing to copy, nothing to train
    again = run(study)
    assert again.outcomes == {}
    assert {c.key: c.run_id for c in read_cells(study.tracking_uri, "new")} == {
        k: c.run_id for k, c in mine.items()
    }
    # a copy that a kill cut short (status still pending) is deleted and copied again
    cut = mine[base[1].key].run_id
    StudyTracker(study.tracking_uri, "new").set_status(cut, "pending")
    # the only thing left to do: a SLURM job starts its Ray for it too, not "nothing to run"
    assert _to_run(study, False, False, SlurmRun(), io.StringIO()) is not None
    out = io.StringIO()
    run_study(study, executor="local", progress=False, stream=out)
    assert "1 of 3 baseline seeds to reuse from study ref" in out.getvalue()
    redone = {c.key: c for c in read_cells(study.tracking_uri, "new")}[base[1].key]
    assert redone.run_id != cut and redone.status == "finished"
    assert history(study.tracking_uri, redone.run_id) == history(
        ref.tracking_uri, theirs[base[1].key].run_id
    )


def test_a_store_named_by_uri_serves_alike_and_a_missing_one_is_refused(source, tmp_path):
    ref = load_study(source)
    by_uri = raw("by_uri", tmp_path, [0], baseline_from={"uri": ref.tracking_uri, "name": "ref"})
    assert [p.action for p in plan(parse_study(by_uri))][0] == "reuse"
    nowhere = tmp_path / "never_run.yaml"
    nowhere.write_text(yaml.safe_dump(raw("never_run", tmp_path, [0])))
    spec = raw("orphan", tmp_path, [0], baseline_from=str(nowhere))
    with pytest.raises(CannotRunError, match="baseline_from: study never_run in .*run that study"):
        run(parse_study(spec))
    assert not (tmp_path / "orphan").exists()  # refused before anything was written


def _closed_port() -> int:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "uri, match",
    [
        ("http://127.0.0.1:{port}/", "no MLflow tracking server answers at http://127.0.0.1"),
        ("postgresql://u@localhost/x", r"unsupported tracking URI 'postgresql://.*sqlite:///"),
        ("runs/ref/mlflow.db", r"unsupported tracking URI 'runs/ref/mlflow.db': use sqlite:///"),
        ("sqlite:///{tmp}/text.db", "the tracking store .*text.db is damaged or not a SQLite"),
    ],
)
def test_the_source_store_is_checked_as_the_studys_own_at_once(tmp_path, uri, match):
    (tmp_path / "text.db").write_text("not a database\n")
    uri = uri.format(port=_closed_port(), tmp=tmp_path)
    spec = raw("quick", tmp_path, [0], baseline_from={"uri": uri, "name": "ref"})
    t0 = time.monotonic()
    with pytest.raises(CannotRunError, match=f"^baseline_from.uri: {match}"):
        run(parse_study(spec))
    assert time.monotonic() - t0 < 15  # one request, never the store's retries (120 s)
    assert not (tmp_path / "quick").exists()
    assert (tmp_path / "text.db").read_text() == "not a database\n"


@pytest.mark.parametrize(
    "value, match",
    [
        ("no/such/study.yaml", "baseline_from: no/such/study.yaml: no such study file"),
        ({"uri": "sqlite:///x.db"}, "baseline_from.*needs the study's name"),
        ({"study": "a.yaml", "uri": "sqlite:///x.db"}, "baseline_from.*one of the two"),
        ({"uri": "sqlite:///x.db", "name": "x", "seeds": 3}, "baseline_from.*seeds"),
    ],
)
def test_a_bad_baseline_from_names_the_field(tmp_path, value, match):
    with pytest.raises(StudyError, match=match):
        parse_study(raw("bad", tmp_path, [0], baseline_from=value))


def test_baseline_from_needs_a_baseline(tmp_path, source):
    spec = raw("nobase", tmp_path, [0], baseline_from=str(source))
    del spec["baseline"]
    with pytest.raises(
        StudyError, match="baseline_from: names the baseline's cells, but the study"
    ):
        parse_study(spec)
