"""A cell interrupted on data that prepare to other tokens now (a corpus file changed since): `plan`
says its data changed before they are prepared and marks it stale-data once they are, and `run`
refuses before anything starts, naming the field that changed, with nothing recorded changed, until
the data are restored or --rerun-stale trains it anew; files only touched resume as before; a
finished cell whose data changed stays a result, and `plan` says so, until --rerun-stale trains it
anew once its data are known to prepare to other tokens (touched files: never). Real tiny runs on
a local text corpus and its validation corpus, real MLflow (SQLite under tmp_path)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.driver.planning import plan
from ablate.driver.runner import run_study
from ablate.slurm.session import SlurmRun, _to_run
from ablate.study import Study, load_study

STUDY = """
name: c1
base:
  device: cpu
  model: {preset: tiny}
  data: {corpus: text, path: corp/a.txt, val_tokens: 4096, val: {corpus: text, path: corp/v.txt}}
  train: {steps: 9, batch_size: 2, seq_len: 16, eval_every: 3, eval_batches: 2, warmup_steps: 2}
data_cache: cache
grid: {seed: [0]}
"""


def _setup(tmp_path: Path, monkeypatch: Any) -> Study:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corp").mkdir()
    text = "".join(
        f"Paragraph {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(500)
    )
    (tmp_path / "corp" / "a.txt").write_text(text)
    (tmp_path / "corp" / "v.txt").write_text(text[:6000])
    (tmp_path / "c1.yaml").write_text(STUDY)
    s = load_study(tmp_path / "c1.yaml", output=tmp_path / "out")
    first = run_study(s, executor="local", progress=False, stop_after=4)
    assert {o.status for o in first.outcomes.values()} == {"interrupted"}
    return s


def _recorded(s: Study) -> dict[str, Any]:
    """Everything the store holds of the study's runs, and the cells' checkpoint files."""
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name(s.name)
    assert exp is not None
    runs = {}
    for r in client.search_runs([exp.experiment_id]):
        metrics = {
            k: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)]
            for k in r.data.metrics
        }
        runs[r.info.run_id] = (r.info.status, r.data.params, r.data.tags, metrics)
    files = {
        str(p.relative_to(s.output_dir)): p.read_bytes()
        for p in sorted((s.output_dir / "cells").rglob("*"))
        if p.is_file()
    }
    return {"runs": runs, "files": files}


def test_changed_corpus_refuses_before_anything_starts_and_rerun_stale_trains_anew(
    tmp_path, monkeypatch
):
    s = _setup(tmp_path, monkeypatch)
    (cell,) = s.cells
    client = MlflowClient(tracking_uri=s.tracking_uri)
    before = _recorded(s)
    (old_id,) = [rid for rid, (_, prm, _, _) in before["runs"].items() if "data.fingerprint" in prm]
    old_fp = before["runs"][old_id][1]["data.fingerprint"]
    with open(tmp_path / "corp" / "v.txt", "a") as f:  # only the validation corpus
        f.write("more text appended\n")

    # not prepared yet: its tokens are not known (touched files give the same), its files changed
    sets = set((tmp_path / "cache").iterdir())
    (p,) = plan(s)  # prepares nothing
    assert p.action == "resume" and set((tmp_path / "cache").iterdir()) == sets
    assert "its data changed since it trained" in p.why, p.why
    assert f"data.val.path corp/v.txt: {tmp_path}/corp/v.txt changed" in p.why, p.why
    assert "data.path" not in p.why and "run prepares them first" in p.why
    for flags in ([], ["--rerun-failed"]):
        res = CliRunner().invoke(
            main, ["run", "c1.yaml", "--executor", "local", "-o", "out", "--quiet", *flags]
        )
        assert res.exit_code == 2, res.output
        assert "than data.val.path corp/v.txt prepares to now" in res.output, res.output
        assert old_fp in res.output and "data.path" not in res.output
        assert "--rerun-stale" in res.output and "--rerun-failed" not in res.output
        assert "Traceback" not in res.output
        assert _recorded(s) == before  # nothing recorded changed, no checkpoint touched
    (p,) = plan(s)  # prepared by the refused run: its fingerprint is known now
    assert p.action == "stale-data" and old_fp in p.why
    assert "than data.val.path corp/v.txt prepares to now" in p.why
    (p,) = plan(s, rerun_failed=True)
    assert p.action == "stale-data"

    again = run_study(s, executor="local", progress=False, rerun_stale=True)
    assert {o.status for o in again.outcomes.values()} == {"finished"}
    new_id = again.run_ids[cell.key]
    assert new_id != old_id
    assert client.get_run(old_id).data.params["data.fingerprint"] == old_fp  # kept
    new_fp = client.get_run(new_id).data.params["data.fingerprint"]
    assert new_fp != old_fp
    assert (s.checkpoint_dir(cell).parent / f"{cell.key}.stale-{old_id[:12]}").is_dir()
    (p,) = plan(s)
    assert (p.action, p.why) == ("skip", "finished")

    # a finished cell whose training corpus changed since: still a result, and plan says so
    with open(tmp_path / "corp" / "a.txt", "a") as f:
        f.write("appended after it finished\n")
    sets = set((tmp_path / "cache").iterdir())
    (p,) = plan(s)
    assert p.action == "skip" and set((tmp_path / "cache").iterdir()) == sets
    assert p.why.startswith("finished; its data changed since it trained (data.path corp/a.txt: ")
    assert "data.val.path" not in p.why, p.why
    mark, said = _status()
    assert mark == "data files changed" and said.startswith("1 cell(s)' data files changed"), said
    (p,) = plan(s, rerun_stale=True)  # its tokens are not known yet: still a result
    assert p.action == "skip" and p.why.endswith("prepares them first and reruns it if they did")
    res = CliRunner().invoke(main, ["data", "prepare", "c1.yaml", "-o", "out"])
    assert res.exit_code == 0, res.output
    (p,) = plan(s)
    assert p.action == "skip" and p.why.startswith(
        f"finished; trained on other data than data.path corp/a.txt prepares to now "
        f"(data.fingerprint {new_fp}, now "
    ), p.why
    assert p.why.endswith("; --rerun-stale reruns it"), p.why
    mark, said = _status()
    assert mark == "data changed" and said.startswith("1 cell(s) trained on other data than"), said
    # other tokens now: --rerun-stale trains it anew in a new run, the finished one and its
    # checkpoint set aside (kept)
    (p,) = plan(s, rerun_stale=True)
    assert (p.action, p.fresh) == ("rerun", True) and new_fp in p.why, p
    third = run_study(s, executor="local", progress=False, rerun_stale=True)
    assert [p.action for p in third.planned] == ["rerun"]
    assert {o.status for o in third.outcomes.values()} == {"finished"}
    assert third.run_ids[cell.key] not in (old_id, new_id)
    assert client.get_run(new_id).data.params["data.fingerprint"] == new_fp  # kept
    last_fp = client.get_run(third.run_ids[cell.key]).data.params["data.fingerprint"]
    assert last_fp not in (old_fp, new_fp)
    assert (s.checkpoint_dir(cell).parent / f"{cell.key}.stale-{new_id[:12]}").is_dir()
    assert [(p.action, p.why) for p in plan(s, rerun_stale=True)] == [("skip", "finished")]
    assert _status() == ("", "")


def _status() -> tuple[str, str]:
    """What `ablate status` (in the study's folder) says of data changed since cells trained: the
    cell line's mark and the line that sums them up ("" for none)."""
    res = CliRunner().invoke(main, ["status", "c1.yaml", "-o", "out"])
    assert res.exit_code == 0, res.output
    (cell, *rest) = res.output.splitlines()
    mark = next((m for m in ("data files changed", "data changed") if cell.endswith(m)), "")
    said = [line for line in rest if "data" in line]
    assert len(said) <= 1, said
    return mark, said[0] if said else ""


def test_touched_corpus_resumes_in_the_same_run(tmp_path, monkeypatch):
    s = _setup(tmp_path, monkeypatch)
    corpus = tmp_path / "corp" / "a.txt"
    st = corpus.stat()
    os.utime(corpus, (st.st_atime, st.st_mtime + 100))  # a new prepared set, the same tokens
    second = run_study(s, executor="local", progress=False)
    assert [p.action for p in second.planned] == ["resume"]
    assert {o.status for o in second.outcomes.values()} == {"finished"}, second.outcomes
    # touched again once finished: the same tokens, still a result, even with --rerun-stale
    (run_id,) = second.run_ids.values()
    os.utime(corpus, (st.st_atime, st.st_mtime + 200))
    # a requeued SLURM job of the ended study prepares nothing (it could tokenize a corpus) but
    # with --rerun-stale, which needs the tokens to tell: the same, nothing to run either way
    cache = tmp_path / "cache"
    sets = {p for p in cache.iterdir() if p.is_dir()}
    for rerun_stale, prepared in ((False, 0), (True, 1)):
        said = io.StringIO()
        assert _to_run(s, False, rerun_stale, SlurmRun(), said) is None
        assert len({p for p in cache.iterdir() if p.is_dir()} - sets) == prepared
        assert "nothing to run: the study's 1 cells have ended" in said.getvalue()
    third = run_study(s, executor="local", progress=False, rerun_stale=True)
    assert [(p.action, p.why) for p in third.planned] == [("skip", "finished")]
    assert not third.outcomes and [p.run.run_id for p in plan(s) if p.run] == [run_id]
