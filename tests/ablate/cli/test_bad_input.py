"""Every bad study is refused in seconds with exit status 2, one line naming what is wrong, and
nothing written; nothing hangs, nothing tracebacks. A corpus of hostile and mistaken files (each a
case that once hung, tracebacked or slipped through `validate`), a property test over generated
and mutated studies, and the exit statuses of `run` and `status`."""

from __future__ import annotations

import fcntl
import math
import time
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ablate.cli import main
from ablate.study import load_study, parse_study
from ablate.study.axes import fmt_value
from ablate.tracking import StudyTracker, prepare_store

HANG_GUARD_S = 30  # far above the seconds these take; only a hang or a blow-up crosses it

GOOD = """\
name: ok
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 4, batch_size: 4, seq_len: 32, eval_every: 2, warmup_steps: 1}
grid:
  fp4_gemms: [[], [fprop]]
baseline: {fp4_gemms: []}
"""

_BOMB = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)
)

# name -> (file content, a phrase the one-line error must contain)
CORPUS: dict[str, tuple[bytes | str, str]] = {
    "alias bomb in the baseline": (
        "name: bomb\ngrid: {seed: [0]}\na: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + _BOMB
        + "baseline: {seed: *h}\n",
        "expands to more than",
    ),
    "10 axes x 10 values": (
        "name: huge\ngrid:\n"
        "  train.lr: [1.0e-3, 2.0e-3, 3.0e-3, 4.0e-3, 5.0e-3, 6.0e-3, 7.0e-3, 8.0e-3, 9.0e-3, 0.01]\n"
        "  train.warmup_steps: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
        "  train.batch_size: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
        "  train.seq_len: [8, 16, 24, 32, 40, 48, 56, 64, 72, 80]\n"
        "  train.steps: [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]\n"
        "  train.eval_every: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
        "  seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
        "  data.data_seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
        "  train.min_lr_ratio: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]\n"
        "  train.weight_decay: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]\n",
        "10,000,000,000 cells",
    ),
    "binary": (bytes(range(256)) * 4, "not UTF-8"),
    "UTF-16": ("name: u\ngrid: {seed: [0]}\n".encode("utf-16"), "not UTF-8"),
    "invalid UTF-8": (b"name: caf\xe9\ngrid: {seed: [0]}\n", "not UTF-8"),
    "20,000 nested brackets": (
        "name: deep\ngrid: {seed: " + "[" * 20000 + "]" * 20000 + "}\n",
        "nested more than",
    ),
    "a key given twice": (GOOD + "name: other\n", "the key 'name' is given twice"),
    "unusable tracking scheme": (
        GOOD + "tracking: {uri: 'postgresql://db/mlflow'}\n",
        "unsupported tracking URI",
    ),
    "in-memory SQLite": (GOOD + "tracking: {uri: 'sqlite:///:memory:'}\n", "names no database"),
    "no validation window": (
        GOOD.replace("val_tokens: 4096", "val_tokens: 16"),
        "make no validation window",
    ),
    "seed of 10^23": (
        GOOD.replace("fp4_gemms: [[], [fprop]]", "seed: [0, 100000000000000000000000]"),
        "seed",
    ),
    "more cores per cell than the machine": (
        GOOD + "resources: {cpus: 100000}\n",
        "resources.cpus: 100000 per cell",
    ),
    "probe of a block the model lacks": (
        GOOD + "probe: {layers: [0, 9]}\n",
        "probe.layers[1]: block 9 does not exist",
    ),
    "more probe batches than the validation set": (
        GOOD + "probe: {batches: 40}\n",
        "probe.batches: 40 probe batches",
    ),
    "not a mapping": ("- a list\n- not a study\n", "must be a mapping"),
    "empty file": ("", "must be a mapping"),
}


@pytest.mark.parametrize("case", list(CORPUS))
def test_a_bad_study_is_refused_in_seconds_with_exit_2_and_nothing_written(tmp_path, case):
    content, phrase = CORPUS[case]
    p = tmp_path / "study.yaml"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content)
    out = tmp_path / "out"
    for cmd in ("validate", "run"):
        t0 = time.perf_counter()
        local = ["--executor", "local"] if cmd == "run" else []  # never starts Ray if it slips
        res = CliRunner().invoke(main, [cmd, str(p), "-o", str(out), *local])
        took = time.perf_counter() - t0
        assert res.exit_code == 2, (case, cmd, res.output, res.exception)
        assert phrase in res.output, (case, cmd, res.output)
        assert "Traceback" not in res.output and took < HANG_GUARD_S, (case, cmd, took)
        assert len(res.output) < 4000, (case, cmd, len(res.output))
    assert not out.exists()  # nothing written, no lock left behind


def test_a_study_or_data_path_that_is_no_regular_file_exits_2_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe")  # opened, it would block until a writer came
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    says = {
        "/dev/zero": "is not a regular file (a character device)",
        str(tmp_path / "pipe"): "is not a regular file (a named pipe)",
        str(tmp_path / "loop"): "is a symbolic link loop",
    }
    study = tmp_path / "study.yaml"
    for path, phrase in says.items():
        study.write_text(GOOD.replace("data: {", f"data: {{corpus: text, path: '{path}', "))
        for target, line in (
            (path, f"{path}: the study file {phrase}"),
            (str(study), f"base.data.path: '{path}' {phrase}"),
        ):
            t0 = time.perf_counter()
            res = CliRunner().invoke(main, ["validate", target])
            assert res.exit_code == 2, (target, res.output, res.exception)
            assert line in res.output, res.output
            assert "does not exist" not in res.output and "no such" not in res.output
            assert time.perf_counter() - t0 < HANG_GUARD_S


ON_OFF = "0, 1, false, true, no, yes, off, on"
SWITCHES = {
    "ABLATE_EMULATED_GEMM": "fp32, bf16",
    "ABLATE_COMPILE": ON_OFF,
    "ABLATE_QUANT_OPS": ON_OFF,
    "ABLATE_NATIVE_CHECK": ON_OFF,
}


@pytest.mark.parametrize("name", list(SWITCHES))
def test_a_switch_set_to_a_value_it_does_not_allow_is_refused_before_anything_starts(
    tmp_path, monkeypatch, name
):
    p = tmp_path / "study.yaml"
    p.write_text(GOOD)
    gpus = tmp_path / "gpus.yaml"  # for other machines: validate checks the study alone
    gpus.write_text(GOOD + "resources: {gpus: 1}\n")
    out = tmp_path / "out"
    monkeypatch.setenv(name, "garbage")
    said = f"environment variable {name}: unknown 'garbage'; allowed: {SWITCHES[name]}"
    for cmd, study in [("validate", p), ("plan", p), ("run", p), ("validate", gpus), ("probe", p)]:
        local = ["--executor", "local", "--quiet"] if cmd == "run" else []
        res = CliRunner().invoke(main, [cmd, str(study), "-o", str(out), *local])
        assert res.exit_code == 2, (cmd, res.output, res.exception)
        assert said in res.output and "Traceback" not in res.output, (cmd, res.output)
    assert not out.exists()
    monkeypatch.setenv(name, "1" if SWITCHES[name] == ON_OFF else "fp32")
    assert CliRunner().invoke(main, ["validate", str(p), "-o", str(out)]).exit_code == 0


@pytest.mark.parametrize(
    "name, bad, said",
    [
        (
            "ABLATE_COMPILE_BACKEND",
            "indutor",
            "allowed: a torch.compile backend such as aot_eager, ",
        ),
        ("ABLATE_NO_KERNEL", "garbage", f"allowed: {ON_OFF} in any case"),
    ],
)
def test_a_compile_backend_or_kernel_switch_torch_or_ablate_lacks_is_refused_at_validate(
    tmp_path, monkeypatch, name, bad, said
):
    p = tmp_path / "study.yaml"
    p.write_text(GOOD)
    monkeypatch.setenv(name, bad)
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"environment variable {name}: unknown {bad!r}; {said}" in res.output, res.output
    assert "Traceback" not in res.output
    monkeypatch.setenv(name, "")  # empty is unset
    assert (
        CliRunner().invoke(main, ["validate", str(p), "-o", str(tmp_path / "out")]).exit_code == 0
    )


@pytest.mark.parametrize(
    "value, on",
    [("0", False), ("1", True), ("false", False), ("TRUE", True), ("No", False), ("yes", True)]
    + [("off", False), ("ON", True)],
)
def test_an_on_off_switch_takes_the_words_people_write_and_false_means_off(
    tmp_path, monkeypatch, value, on
):
    from backends.env import flag
    from backends.quant import ops, torch_path

    p = tmp_path / "study.yaml"
    p.write_text(GOOD)
    for name in ("ABLATE_COMPILE", "ABLATE_QUANT_OPS", "ABLATE_NATIVE_CHECK"):
        monkeypatch.setenv(name, value)
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert torch_path.compile_enabled(torch.device("cuda")) is on  # (asks no GPU)
    assert ops.traced_inline() is not on
    assert flag("ABLATE_NATIVE_CHECK", not on) is on


def test_the_grid_cap_is_checked_before_expanding_and_raised_with_an_option(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        GOOD.replace("fp4_gemms: [[], [fprop]]", "fp4_gemms: [[], [fprop]]\n  seed: [0, 1, 2]")
    )
    res = CliRunner().invoke(main, ["validate", str(p), "--max-cells", "5"])
    assert res.exit_code == 2 and "grid: 6 cells (2x3) is more than the 5 allowed" in res.output
    assert "--max-cells" in res.output
    res = CliRunner().invoke(main, ["validate", str(p), "--max-cells", "6"])
    assert res.exit_code == 0, res.output
    assert len(load_study(p, max_cells=6).cells) == 6


def test_error_messages_never_materialise_a_huge_value():
    x: list = [1] * 10
    for _ in range(30):  # 10^31 leaves once expanded: walking it would never end
        x = [x] * 10
    t0 = time.perf_counter()
    text = fmt_value(x, limit=200)
    assert len(text) == 200 and text.endswith("...") and time.perf_counter() - t0 < 1
    assert fmt_value([0.003, "a", [1]]) == "[0.003,a,[1]]"  # short values are whole


# --- property test: generated and mutated studies ------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["name", "base", "grid", "exclude", "baseline", "target", "resources", "tracking", "tune",
     "speedup", "output", "seed", "fp4_gemms", "intervention", "train.lr", "train.steps",
     "model", "data", "train", "val_tokens", "preset", "zip", "xyz"]
)  # fmt: skip


def _mutate(study: dict, path: list[str], value: object) -> dict:
    """``study`` with the value at ``path`` (created as needed) replaced by ``value``."""
    d = study
    for k in path[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[path[-1]] = value
    return study


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mutations=st.lists(st.tuples(st.lists(_keys, min_size=1, max_size=3), _values), max_size=3),
    garbage=st.one_of(st.none(), st.text(max_size=40)),
)
def test_validate_never_raises_and_answers_0_or_2_in_bounded_time(tmp_path, mutations, garbage):
    study = yaml.safe_load(GOOD)
    for path, value in mutations:
        study = _mutate(study, path, value)
    text = yaml.safe_dump(study, allow_unicode=True) if garbage is None else garbage
    p = tmp_path / "prop.yaml"
    p.write_text(text, encoding="utf-8")
    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(tmp_path / "never")])
    assert res.exit_code in (0, 2), (text, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), (text, res.exception)
    assert time.perf_counter() - t0 < HANG_GUARD_S
    assert not (tmp_path / "never").exists()


# --- exit statuses -------------------------------------------------------------------------------


def _recorded(tmp_path: Path, status_of_first: str) -> tuple[Path, Path]:
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    out = tmp_path / "out"
    study = parse_study(yaml.safe_load(GOOD), output=out, text=GOOD)
    prepare_store(study.tracking_uri, out)
    tracker = StudyTracker(study.tracking_uri, study.name)
    parent = tracker.parent_run(GOOD)
    c = study.cells[0]
    rid = tracker.create_run(parent, c.key, c.label, {}, {})
    tracker.set_status(
        rid, status_of_first, {"reason": "boom"} if status_of_first == "failed" else {}
    )
    return p, out


def test_a_rerun_that_leaves_a_failed_cell_in_place_exits_1_with_the_hint(tmp_path):
    p, out = _recorded(tmp_path, "failed")
    res = CliRunner().invoke(
        main, ["run", str(p), "-o", str(out), "--executor", "local", "--quiet", "--no-report"]
    )
    assert res.exit_code == 1, res.output
    assert "1 cell(s) failed before and were left as they are" in res.output
    assert "--rerun-failed" in res.output


def test_status_tells_a_running_cell_from_one_whose_driver_is_gone(tmp_path):
    p, out = _recorded(tmp_path, "running")
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
    assert " running " in res.output and "abandoned" not in res.output  # never run: no lock file
    lock = out / ".lock"
    lock.write_text("pid 1 on gone")  # a driver that was killed leaves its lock file, unlocked
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
    assert "abandoned" in res.output and "run the study again to resume them" in res.output
    with open(lock) as held:  # a live driver holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
        assert " running " in res.output and "abandoned" not in res.output


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_a_damaged_store_is_refused_by_every_command_with_exit_2_and_left_as_it_is(
    tmp_path, damage
):
    p, out = _recorded(tmp_path, "finished")
    db = out / "mlflow.db"
    if damage == "truncated":
        with open(db, "r+b") as f:
            f.truncate(db.stat().st_size // 2)
    else:
        db.write_text("not a database\n")
    before = db.read_bytes()
    for cmd in ("validate", "plan", "status", "report", "run"):
        extra = ["--executor", "local", "--no-report"] if cmd == "run" else []
        extra += ["--runs", str(out)] if cmd == "report" else ["-o", str(out)]
        res = CliRunner().invoke(main, [cmd, str(p), *extra])
        assert res.exit_code == 2, (cmd, res.output, res.exception)
        assert f"the tracking store {db} is damaged or not a SQLite database" in res.output, cmd
        assert "Traceback" not in res.output and "sqlalchemy" not in res.output, cmd
        assert db.read_bytes() == before, cmd  # never touched


def test_reading_commands_leave_an_empty_store_file_empty(tmp_path):
    p, out = _recorded(tmp_path, "finished")
    db = out / "mlflow.db"
    db.write_bytes(b"")  # `ablate run` takes it as a new store; nothing else writes it
    for cmd in ("validate", "plan", "status", "report"):
        extra = ["--runs", str(out)] if cmd == "report" else ["-o", str(out)]
        res = CliRunner().invoke(main, [cmd, str(p), *extra])
        assert "Traceback" not in res.output, (cmd, res.output)
        assert db.stat().st_size == 0, (cmd, res.output)
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out)])
    assert "no MLflow store at" in res.output and "(an empty file)" in res.output


def test_a_tracking_uri_no_store_answers_at_is_refused_in_seconds_by_every_reader(
    tmp_path, monkeypatch
):
    """--tracking-uri replaces the study's tracking.uri: checked as that is, before anything is
    read (an unreachable server was once retried for minutes; another scheme got MLflow's text)."""
    import socket

    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, exported = tmp_path / "out", tmp_path / "exported"
    for uri, says in [
        ("bogus://x", "unsupported tracking URI 'bogus://x'"),
        ("sqlite:///", "the tracking URI sqlite:/// names no database file"),
        (
            f"http://127.0.0.1:{port}",
            f"no MLflow tracking server answers at http://127.0.0.1:{port}",
        ),
    ]:
        for args in (
            ["status", str(p), "-o", str(out)],
            ["report", str(p), "--runs", str(out)],
            ["report", "--study", "ok"],
            ["export", str(p), "--cell", "bf16/seed0", "-o", str(exported), "--output", str(out)],
        ):
            t0 = time.perf_counter()
            res = CliRunner().invoke(main, [*args, "--tracking-uri", uri])
            assert res.exit_code == 2, (args, uri, res.output, res.exception)
            assert f"--tracking-uri: {says}" in res.output, (args, res.output)
            assert "Traceback" not in res.output and time.perf_counter() - t0 < HANG_GUARD_S
    assert not out.exists() and not exported.exists() and not (tmp_path / "reports").exists()


def test_report_refuses_options_that_do_not_go_together_or_a_study_not_there_with_exit_2(
    tmp_path, monkeypatch
):
    """--study goes with --tracking-uri alone, --runs with a study file (each was once ignored);
    a study the store lacks, or whose kept study.yaml is another study's, is refused naming
    --study; with no study file the store's own folder is its output folder (-o may not be it)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    p, out = _recorded(tmp_path, "finished")
    uri = f"sqlite:///{out}/mlflow.db"
    stored = sorted(x.relative_to(out) for x in out.rglob("*"))
    at = ["--tracking-uri", uri, "--study"]
    for args, says in [
        ([str(p), "--study", "ok", "--runs", str(out)], "--study goes with --tracking-uri and no"),
        ([*at, "ok", "--runs", str(out)], "--runs goes with a STUDY.yaml"),
        ([*at, "nosuch"], f"--study: study 'nosuch' has no MLflow experiment 'nosuch' in {uri}"),
        ([*at, "ok", "-o", str(out)], "is the study's output folder"),
        ([*at, "ok", "-o", str(out / "cells")], "where the study's records are"),
    ]:
        res = CliRunner().invoke(main, ["report", *args])
        assert res.exit_code == 2 and says in res.output, (args, res.output, res.exception)
        assert "Traceback" not in res.output, (args, res.output)
    assert sorted(x.relative_to(out) for x in out.rglob("*")) == stored
    parent = StudyTracker(uri, "ok").parent_run(GOOD)
    MlflowClient(uri).log_text(parent, GOOD.replace("name: ok", "name: other"), "study.yaml")
    res = CliRunner().invoke(main, ["report", *at, "ok"])
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"--study: the study.yaml kept for study ok in {uri} is study 'other'" in res.output
    assert not (tmp_path / "reports").exists()


def test_report_refuses_an_out_folder_it_cannot_make_before_reading_the_store(tmp_path):
    """-o under a file, or where no folder can be made (/proc), once tracebacked after the store
    was read; refused first, naming -o/--out."""
    p, out = _recorded(tmp_path, "finished")
    for bad, says in [
        (p / "x", f"-o/--out: {p / 'x'} cannot be made or written ({p} is not a folder)"),
        (Path("/proc/ablate-report"), "-o/--out: /proc/ablate-report cannot be made or written"),
    ]:
        res = CliRunner().invoke(main, ["report", str(p), "--runs", str(out), "-o", str(bad)])
        assert res.exit_code == 2 and says in res.output, (bad, res.output, res.exception)
        assert "Traceback" not in res.output, res.output


def _curves(tmp_path: Path, odd: dict[int, float]) -> tuple[Path, Path]:
    """A store of GOOD's two cells finished, their loss falling over steps 0, 2, 4, the fprop
    cell's points at the steps of ``odd`` set to those losses (as a damaged store could hold)."""
    p, out = _recorded(tmp_path, "finished")
    study = load_study(p, output=out)
    tracker = StudyTracker(study.tracking_uri, study.name)
    runs = {c.key: tracker.cell_runs()[c.key].run_id for c in study.cells[:1]}
    c = study.cells[1]
    runs[c.key] = tracker.create_run(tracker.parent_run(GOOD), c.key, c.label, {}, {})
    for (key, rid), slower in zip(runs.items(), (0.0, 0.1), strict=True):
        points = {s: 5.0 - 0.5 * s + slower for s in (0, 2, 4)}
        if key == c.key:
            points |= odd
        for step, loss in points.items():
            tracker.log_metrics(rid, {"val_loss": loss, "tokens": 4 * 32 * max(step, 0)}, step)
        tracker.set_status(rid, "finished")
    return p, out


def test_report_takes_a_negative_or_minus_infinite_loss_in_the_store_for_divergence(tmp_path):
    """MLflow stores -inf as the most negative float: its exp, a perplexity of 0, once broke the
    report with a math domain error; no cross-entropy is negative, so the curve ends there."""
    for i, loss in enumerate((-math.inf, -1.0)):
        (tmp_path / str(i)).mkdir()
        p, out = _curves(tmp_path / str(i), {2: loss})
        res = CliRunner().invoke(
            main, ["report", str(p), "--runs", str(out), "--no-attach", "-o", str(tmp_path / "r")]
        )
        assert res.exit_code == 0, (loss, res.output, res.exception)
        assert "mxfp4[fprop]/bf16" in res.output and "0/1 reached" in res.output, res.output


def test_report_refuses_a_point_at_a_negative_step_naming_the_cell_and_run(tmp_path):
    """A loss at step -5 once passed for the target reached before training (-74% tokens), or
    got the target blamed; a run counts steps from 0, so the store was written by something else."""
    p, out = _curves(tmp_path, {-5: 0.1})
    res = CliRunner().invoke(
        main, ["report", str(p), "--runs", str(out), "--no-attach", "-o", str(tmp_path / "r")]
    )
    assert res.exit_code == 1 and "Traceback" not in res.output, (res.output, res.exception)
    assert "cell mxfp4[fprop]/bf16: its run " in res.output and "val_loss at step -5" in res.output
    assert not (tmp_path / "r").exists()


def test_report_of_a_study_whose_parent_run_keeps_no_study_yaml_says_so_with_exit_2(tmp_path):
    p, out = _recorded(tmp_path, "finished")
    (kept,) = out.rglob("study.yaml")  # its artifacts removed by hand
    kept.unlink()
    uri = f"sqlite:///{out}/mlflow.db"
    res = CliRunner().invoke(main, ["report", "--tracking-uri", uri, "--study", "ok"])
    assert res.exit_code == 2, (res.output, res.exception)
    assert "study 'ok': its parent run " in res.output and "keeps no study.yaml" in res.output
    assert "download_artifacts" not in res.output and "Traceback" not in res.output


def test_report_refuses_an_empty_out_path_which_would_be_the_current_folder(tmp_path, monkeypatch):
    """-o "" (an unset variable) once scattered report.md, summary.csv and the figures among the
    files of the current folder, replacing any of those names."""
    monkeypatch.chdir(tmp_path)
    p, out = _curves(tmp_path, {})
    (tmp_path / "summary.csv").write_text("mine")
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(out), "-o", ""])
    assert res.exit_code == 2 and "-o/--out: an empty path" in res.output, res.output
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out", "s.yaml", "summary.csv"]
    assert (tmp_path / "summary.csv").read_text() == "mine"


def test_an_empty_output_folder_option_is_refused_not_taken_for_the_current_folder(
    tmp_path, monkeypatch
):
    """-o "" was Path(""): `run` made its store and checkpoints among the current folder's files."""
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    for args, opt in [
        (["run", str(p), "--executor", "local", "--quiet", "-o", ""], "-o/--output"),
        (["status", str(p), "-o", " "], "-o/--output"),
        (["report", str(p), "--runs", ""], "--runs"),
        (["export", str(p), "--cell", "bf16", "-o", "x", "--output", ""], "--output"),
    ]:
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output, res.exception)
        assert f"{opt}: an empty path; give the study's output folder" in res.output, res.output
    assert [f.name for f in tmp_path.iterdir()] == ["s.yaml"]


def test_an_output_folder_option_that_names_a_file_is_refused_as_no_folder(tmp_path, monkeypatch):
    """`report --runs <a file>` said "no MLflow store at <file>/mlflow.db"; `run -o <a file>`
    failed later, making the folders: a file given for the output folder is named as such."""
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    (tmp_path / "afile").write_text("mine")
    for args, opt in [
        (["run", str(p), "--executor", "local", "--quiet", "-o", "afile"], "-o/--output"),
        (["status", str(p), "-o", "afile"], "-o/--output"),
        (["report", str(p), "--runs", "afile"], "--runs"),
    ]:
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output, res.exception)
        assert f"{opt}: afile is not a folder; give the study's output folder" in res.output
    assert sorted(f.name for f in tmp_path.iterdir()) == ["afile", "s.yaml"]
    assert (tmp_path / "afile").read_text() == "mine"


def test_an_empty_tracking_uri_is_refused_not_taken_for_the_studys(tmp_path, monkeypatch):
    """`--tracking-uri ''` beside a study file was taken as unset: the study's own store was read
    (or written, by `run`) where the user had named another."""
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    for cmd in (["status"], ["report"], ["plan"], ["run", "--executor", "local", "--quiet"]):
        res = CliRunner().invoke(main, [cmd[0], str(p), *cmd[1:], "--tracking-uri", ""])
        assert res.exit_code == 2, (cmd, res.output, res.exception)
        assert "--tracking-uri: an empty URI" in res.output, res.output
    assert [f.name for f in tmp_path.iterdir()] == ["s.yaml"]
