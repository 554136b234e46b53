"""The study's driver lock in its tracking store (real SQLite): a second driver with another output
folder refuses naming the holder, stale claims are taken over, two drivers started at once leave
one running; and end to end, two real `ablate run` processes on one store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ablate.errors import RunnerError
from ablate.tracking import StudyTracker, default_uri, prepare_store
from ablate.tracking.lock import Holder

HOST = socket.gethostname()


@pytest.fixture
def tracker(tmp_path: Path) -> StudyTracker:
    uri = default_uri(tmp_path / "store")
    prepare_store(uri, tmp_path / "store")
    return StudyTracker(uri, "s")


def _lock(tracker: StudyTracker, output: str, notes: list[str] | None = None, **kw):
    lock = tracker.driver_lock(
        "run",
        command="ablate run",
        output=output,
        error=RunnerError,
        note=None if notes is None else notes.append,
    )
    for k, v in kw.items():
        setattr(lock, k, v)
    return lock


def _tags(tracker: StudyTracker) -> dict[str, str]:
    exp = MlflowClient(tracking_uri=tracker.uri).get_experiment(tracker.experiment_id)
    return {k: v for k, v in exp.tags.items() if k.startswith("ablate.driver.")}


def test_a_second_driver_with_another_output_folder_refuses_naming_the_holder(tracker):
    with _lock(tracker, "/runs/a") as held:
        (tag,) = _tags(tracker)
        assert tag == f"ablate.driver.run.{held.holder.id}"
        assert [h.output for h in tracker.drivers("run")] == ["/runs/a"]
        with pytest.raises(RunnerError) as e:
            _lock(tracker, "/runs/b").acquire()
        msg = str(e.value)
        assert msg.startswith(
            f"study s: another driver holds it in the tracking store {tracker.uri}"
        )
        assert f"`ablate run` (pid {os.getpid()} on {HOST}, output folder /runs/a, since " in msg
        assert (
            f"kill {os.getpid()}` on {HOST}" in msg
            and "lapses 180 s after its last heartbeat" in msg
        )
        assert len(_tags(tracker)) == 1  # the refused driver left no claim behind
        assert tracker.drivers("tune") == []  # `ablate tune` has a lock of its own
    assert _tags(tracker) == {} and tracker.drivers("run") == []  # released
    with _lock(tracker, "/runs/b"):  # now free
        pass


def test_the_holder_refreshes_its_heartbeat_and_a_stale_claim_is_taken_over(tracker):
    with _lock(tracker, "/runs/a", heartbeat_s=0.2) as held:
        first = Holder.parse(_tags(tracker)[held.tag])
        time.sleep(1.0)
        later = Holder.parse(_tags(tracker)[held.tag])
        assert first and later and later.heartbeat > first.heartbeat and later.state == "held"
    # a driver on another machine whose heartbeat stopped 200 s ago (killed, machine lost)
    client = MlflowClient(tracking_uri=tracker.uri)
    old = time.time() - 200
    gone = Holder("0-elsewhere-7", "elsewhere", 7, "/runs/x", "ablate run", old, old, "held")
    client.set_experiment_tag(
        tracker.experiment_id, "ablate.driver.run.0-elsewhere-7", gone.to_json()
    )
    notes: list[str] = []
    with _lock(tracker, "/runs/b", notes) as held:
        assert list(_tags(tracker)) == [held.tag]
    assert notes == [
        "note: took over study s's lock from `ablate run` (pid 7 on elsewhere, output folder "
        f"/runs/x, since {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(old))}, last "
        "heartbeat 200 s ago): its last heartbeat is 200 s old (more than 180 s)"
    ]
    # a driver on this machine whose process is gone, heartbeat fresh: taken over at once
    dead = subprocess.Popen(["true"])  # its pid, free once it has exited
    dead.wait()
    now = time.time()
    h = Holder(f"1-{HOST}-{dead.pid}", HOST, dead.pid, "/runs/y", "ablate run", now, now, "held")
    client.set_experiment_tag(tracker.experiment_id, f"ablate.driver.run.{h.id}", h.to_json())
    notes.clear()
    with _lock(tracker, "/runs/b", notes):
        pass
    assert len(notes) == 1
    assert notes[0].endswith(f"its process {dead.pid} no longer exists on {HOST}")


def test_of_drivers_started_at_once_one_holds_the_lock(tracker):
    go = threading.Barrier(4)
    got: list[str] = []
    refused: list[str] = []
    release = threading.Event()

    def driver(i: int) -> None:
        lock = _lock(tracker, f"/runs/{i}")
        go.wait()
        try:
            lock.acquire()
        except RunnerError as e:
            refused.append(str(e))
            return
        got.append(lock.holder.output)
        release.wait(30)
        lock.release()

    threads = [threading.Thread(target=driver, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)  # every driver is through its acquire (0.5 s settle)
    assert len(got) <= 1, got
    assert len(got) + len(refused) == 4, (got, refused)
    release.set()
    for t in threads:
        t.join()
    assert all("another driver holds it" in r for r in refused)
    assert _tags(tracker) == {}


def _study_file(tmp_path: Path, store: Path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(
        f"""
name: two
tracking: {{uri: "sqlite:///{store / "mlflow.db"}"}}
base:
  model: {{preset: tiny}}
  data: {{val_tokens: 4096}}
  train: {{steps: 300, batch_size: 4, seq_len: 32, eval_every: 100, warmup_steps: 2, eval_batches: 4}}
grid: {{seed: [0]}}
"""
    )
    return p


@pytest.mark.slow
def test_two_driver_processes_with_other_output_folders_on_one_store_run_the_study_once(tmp_path):
    store = tmp_path / "store"  # a new file: the two drivers also race to create it
    study = _study_file(tmp_path, store)
    outs = [tmp_path / "out1", tmp_path / "out2"]

    def driver(out: Path) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "ablate.cli", "run", str(study), "-o", str(out),
               "--executor", "local", "--quiet", "--no-report"]  # fmt: skip
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [driver(o) for o in outs]
    texts = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1], texts
    win, lose = (0, 1) if codes[0] == 0 else (1, 0)
    assert "1 run" in texts[win], texts[win]
    msg = texts[lose]
    assert "another driver holds it in the tracking store" in msg, msg
    assert f"`ablate run` (pid {procs[win].pid} on {HOST}, output folder {outs[win]}," in msg
    assert "Traceback" not in msg and not outs[lose].exists()  # refused before it wrote anything
    # one parent run and one cell run, every step once: nothing was trained twice
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("two")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["ablate.role"] for r in runs) == ["cell", "study"]
    (cell,) = [r for r in runs if r.data.tags["ablate.role"] == "cell"]
    steps = [m.step for m in client.get_metric_history(cell.info.run_id, "train_loss")]
    assert steps == list(range(1, 301))
    assert not [k for k in exp.tags if k.startswith("ablate.driver.")]  # released at exit
    # the refused driver, run again once the other has ended: takes the lock, finds it all done
    # (in this process: what the race needed separate processes for is over)
    from click.testing import CliRunner

    from ablate.cli import main

    again = CliRunner().invoke(
        main, ["run", str(study), "-o", str(outs[lose]), "--executor", "local", "--quiet",
               "--no-report"],
    )  # fmt: skip
    assert again.exit_code == 0 and "1 skip" in again.stderr, again.output


def test_status_calls_no_cell_abandoned_while_a_driver_elsewhere_holds_the_study(tmp_path):
    from click.testing import CliRunner
    from test_bad_input import _recorded

    from ablate.cli import main
    from ablate.study import load_study

    p, out = _recorded(tmp_path, "running")
    (out / ".lock").write_text("pid 1 on gone")  # run from here before; that driver is gone
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
    assert "abandoned" in res.output, res.output
    study = load_study(p, output=out)
    tracker = StudyTracker(study.tracking_uri, study.name)
    with tracker.driver_lock("run", command="ablate run", output="/elsewhere/out"):
        res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
    assert " running " in res.output and "abandoned" not in res.output, res.output
