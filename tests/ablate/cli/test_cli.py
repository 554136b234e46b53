"""The CLI resolves recipe shorthands and turns library errors into usage errors, and starts
without the libraries only some commands need."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ablate.cli import main


def test_recipe_shows_each_gemm_operand():
    res = CliRunner().invoke(
        main, ["recipe", "--fp4", "fprop,dgrad,wgrad", "--intervention", "dht", "--base", "fp8"]
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "mxfp4[fprop,dgrad,wgrad]+dht16/fp8"
    assert lines[1].split() == [
        "gemm",
        "operand",
        "format",
        "rounding",
        "prescale",
        "block",
        "hadamard",
    ]
    assert lines[6].split() == ["wgrad", "dy", "mxfp4", "rne", "-", "1x32", "16", "none"]
    # aligned: every column starts at the same offset on every row
    starts = [lines[1].index(h) for h in ("operand", "format", "block", "hadamard")]
    for line in lines[2:8]:
        for pos in starts:
            assert line[pos - 2 : pos] == "  " and line[pos] != " ", (line, pos)


def test_recipe_json_is_the_resolved_table():
    res = CliRunner().invoke(main, ["recipe", "--fp4", "wgrad", "--intervention", "sr", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert set(d) == {"gemms", "keep_first", "keep_last", "layers"}
    assert d["gemms"]["wgrad"]["a"] == {
        "operand": "dy",
        "format": "mxfp4",
        "rounding": "sr",
        "prescale": True,
        "block": [1, 32],
    }
    assert d["gemms"]["fprop"]["a"]["format"] == "bf16" and d["gemms"]["fprop"]["hadamard"] is None


def test_recipe_by_name_as_json_and_as_a_table():
    res = CliRunner().invoke(main, ["recipe", "nvidia_nvfp4", "--keep-last", "2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["gemms"]["fprop"]["b"]["block"] == [16, 16]
    assert d["gemms"]["dgrad"]["a"]["rounding"] == "sr"
    assert d["gemms"]["wgrad"]["hadamard"] == {"size": 16, "signs": "fixed"}
    assert d["gemms"]["fprop"]["hadamard"] is None and d["keep_last"] == 2
    assert d["layers"] == {"types": None, "blocks": None}
    res = CliRunner().invoke(main, ["recipe", "tseng_mxfp4"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "tseng_mxfp4/bf16"
    assert lines[4].split() == ["dgrad", "dy", "mxfp4", "sr", "3/4", "1x32", "64", "random"]


def test_the_2026_recipes_resolve_by_name():
    for name, check in [
        ("four_over_six", lambda d: d["gemms"]["fprop"]["a"]["scale_rule"] == "mse"),
        ("quartet_ii", lambda d: d["gemms"]["wgrad"]["a"]["rounding"] == "eden"),
        ("tetrajet_v2", lambda d: d["gemms"]["dgrad"]["b"]["outer_block"] == 128),
        ("nvidia_nvfp4_4over6", lambda d: d["gemms"]["fprop"]["b"]["scale_rule"] == "mae"),
    ]:
        res = CliRunner().invoke(main, ["recipe", name, "--json"])
        assert res.exit_code == 0, res.output
        assert check(json.loads(res.stdout)), name
    res = CliRunner().invoke(main, ["recipe", "four_over_six"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1].split() == [
        "gemm",
        "operand",
        "format",
        "rounding",
        "prescale",
        "block",
        "scale",
        "hadamard",
    ]
    assert lines[4].split() == ["dgrad", "dy", "nvfp4", "sr", "16/17", "1x16", "4/6-mse", "-"]


def test_recipe_shows_a_partial_override_with_the_changed_field():
    res = CliRunner().invoke(main, ["recipe", "nvidia_nvfp4", "--set", "wgrad.hadamard=null"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "nvidia_nvfp4~wgrad.hadamard=none"
    assert lines[6].split() == ["wgrad", "dy", "nvfp4", "sr", "-", "1x16", "-"]
    res = CliRunner().invoke(
        main, ["recipe", "{name: nvidia_nvfp4, dgrad: {dy: {rounding: rne}}}", "--json"]
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["gemms"]["dgrad"]["a"]["rounding"] == "rne"
    assert d["gemms"]["wgrad"]["a"]["rounding"] == "sr"  # only the named field changed
    res = CliRunner().invoke(main, ["recipe", "nvidia_nvfp4", "--set", "wgrad.hadmard=null"])
    assert res.exit_code == 2 and "recipe.wgrad.hadmard: unknown key" in res.output
    assert "did you mean 'hadamard'" in res.output
    res = CliRunner().invoke(main, ["recipe", "--set", "wgrad.hadamard=null"])
    assert res.exit_code == 2 and "give its NAME first" in res.output


def test_recipe_unknown_name_or_name_with_shorthand_is_a_usage_error():
    res = CliRunner().invoke(main, ["recipe", "nvidia"])
    assert res.exit_code == 2 and "allowed: nvidia_nvfp4, tseng_mxfp4" in res.output
    res = CliRunner().invoke(main, ["recipe", "quartet", "--fp4", "wgrad"])
    assert res.exit_code == 2 and "give one or the other" in res.output


def test_recipe_bad_gemm_is_a_usage_error_naming_allowed_values():
    res = CliRunner().invoke(main, ["recipe", "--fp4", "wgard"])
    assert res.exit_code == 2
    assert "allowed: fprop, dgrad, wgrad" in res.output
    res = CliRunner().invoke(main, ["recipe", "nvidia_nvfp4", "--set", "wgrad..x=1"])
    assert res.exit_code == 2 and "'wgrad..x=1' is not PATH=VALUE" in res.output, res.output
    res = CliRunner().invoke(main, ["recipe", "--fp4", "fprop,wgrad,fprop"])
    assert res.exit_code == 2 and "fprop listed twice" in res.output, res.output


def test_recipe_yaml_nested_too_deeply_is_a_usage_error_not_a_recursion_error():
    deep = "[" * 20000 + "]" * 20000  # once a RecursionError traceback from the YAML parser
    for args, where in [
        (["nvidia_nvfp4", "--set", f"wgrad.hadamard={deep}"], "--set wgrad.hadamard"),
        ([f"{{name: nvidia_nvfp4, wgrad: {deep}}}"], "NAME"),
    ]:
        res = CliRunner().invoke(main, ["recipe", *args])
        assert res.exit_code == 2 and f"{where}: '" in res.output, res.output
        assert "nested more than 64 levels deep" in res.output and len(res.output) < 1000


# --- study commands ---------------------------------------------------------------------------------

STUDY = """
name: clitest
base:
  model: {preset: tiny}
  data: {val_tokens: 4096}
  train: {steps: 4, batch_size: 4, seq_len: 32, eval_every: 2, eval_batches: 4, warmup_steps: 1}
grid:
  fp4_gemms: [[], [fprop]]
baseline: {fp4_gemms: []}
"""


def _write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_bad_study_exits_2_naming_the_path_before_writing_anything(tmp_path):
    p = _write(tmp_path, STUDY.replace("[[], [fprop]]", "[[], [frpop]]"))
    out = tmp_path / "out"
    for cmd in ("validate", "plan", "run", "status"):
        res = CliRunner().invoke(main, [cmd, str(p), "-o", str(out)])
        assert res.exit_code == 2, (cmd, res.output)
        assert "grid.fp4_gemms[1][0]" in res.output and "'wgrad'" in res.output
    assert not out.exists()


def test_validate_plan_and_schema(tmp_path):
    p = _write(tmp_path, STUDY)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["validate", str(p), "-o", str(out)])
    assert res.exit_code == 0 and "2 cells" in res.output and "baseline bf16" in res.output
    res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert [c["action"] for c in d["cells"]] == ["run", "run"]
    assert [c["baseline"] for c in d["cells"]] == [True, False]
    # the seed plan: per comparison, the seeds that decide its break-even at 80% power
    (fprop,) = d["seeds"]["comparisons"]
    assert fprop["config"] == "mxfp4[fprop]/bf16" and fprop["seeds"] >= 2
    assert d["seeds"]["noise"]["source"].startswith("assumed")
    res = CliRunner().invoke(
        main, ["plan", str(p), "-o", str(out), "--noise", "0.06", "--stall-rate", "0.1",
               "--margin", "0.05"]
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "seeds to decide each comparison at 80% power" in res.output
    assert "sigma 0.06 in log tokens to target, 10% of runs stall, declared" in res.output
    assert "a margin of +5.0% tokens: " in res.output
    res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out), "--stall-rate", "0.1"])
    assert res.exit_code == 2 and "--stall-rate goes with --noise" in res.output
    # numbers that pass a range's bounds but mean nothing are usage errors, no traceback
    # (--gpu-tflops 1e-300 once printed 300-digit GPU-hours, 1e-320 "gpu_hours": Infinity in JSON)
    for opt, value in [("--noise", "nan"), ("--gpu-tflops", "nan"), ("--gpu-tflops", "inf"),
                       ("--gpu-tflops", "1e-300"), ("--gpu-tflops", "1e308"),
                       ("--margin", "1"), ("--stall-rate", "nan")]:  # fmt: skip
        res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out), opt, value])
        assert res.exit_code == 2 and opt in res.output and "Traceback" not in res.output, res
    res = CliRunner().invoke(main, ["schema"])
    assert json.loads(res.stdout)["title"] == "StudyFile"
    # a baseline trained past the budget: plan says so, for the study and on its cells
    longer = _write(tmp_path, STUDY + "baseline_extend: 0.5\n")
    res = CliRunner().invoke(main, ["plan", str(longer), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "baseline_extend: 0.5: each baseline seed trains 6 steps" in res.output
    assert "(baseline, trains" in res.output and "past the budget of" in res.output
    res = CliRunner().invoke(main, ["plan", str(longer), "-o", str(out), "--json"])
    base = json.loads(res.stdout)["cells"][0]
    assert base["steps"] > base["schedule_steps"]
    assert not out.exists()


def test_run_local_then_status_and_plan_say_skip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report goes to reports/<study>/ under the current directory
    p = _write(tmp_path, STUDY)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["run", str(p), "-o", str(out), "--executor", "local", "--quiet"]
    )
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out), "--json"])
    rows = json.loads(res.stdout)["cells"]
    assert [r["status"] for r in rows] == ["finished", "finished"]
    assert all(r["step"] == 4 for r in rows)
    res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out)])
    assert "would: skip 2" in res.output
    # one seed per configuration: no paired comparison to measure the noise on, said so
    res = CliRunner().invoke(main, ["plan", str(p), "--noise-from", str(p)])
    assert res.exit_code == 2 and "no MLflow store" in res.output  # not where it ran
    res = CliRunner().invoke(
        main, ["plan", str(p), "--noise-from", str(p), "--noise-output", str(out)]
    )
    assert res.exit_code == 2 and "no comparison there has an interval" in res.output
    assert (tmp_path / "reports" / "clitest" / "report.md").exists()
    from mlflow.tracking import MlflowClient

    from ablate.tracking import default_uri

    client = MlflowClient(tracking_uri=default_uri(out))
    exp = client.get_experiment_by_name("clitest")
    parent = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'study'")[0]
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/convergence.png"} <= attached
    # -o: a file, the study's output folder or a folder inside it are refused before anything
    # is read or written (the report was once copied into the artifacts it attaches to itself)
    stored = sorted(p.relative_to(out) for p in out.rglob("*"))
    for bad, says in [
        (p, "is a file"),
        (out, "is the study's output folder"),
        (out / "artifacts" / "r", "where the study's records are"),
        (out / "cells", "where the study's records are"),
    ]:
        res = CliRunner().invoke(main, ["report", str(p), "--runs", str(out), "-o", str(bad)])
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, res
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == stored
    # a folder of its own in the output folder is fine (make quickstart's runs/<name>/report)
    res = CliRunner().invoke(
        main, ["report", str(p), "--runs", str(out), "-o", str(out / "report")]
    )
    assert res.exit_code == 0 and (out / "report" / "report.md").is_file(), res.output
    # only the report's own files are attached, not what else lies in its folder
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("not the report's")
    res = CliRunner().invoke(
        main, ["report", str(p), "--runs", str(out), "-o", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/notes.txt" not in attached and "report/summary.csv" in attached
    assert (tmp_path / "r" / "report.html").exists() and "target: val ppl" in res.output
    # the report says what produced its numbers: this code, on this machine's CPU, in fp32
    import pandas as pd

    from ablate.train.provenance import code_hash, device_name

    summary = pd.read_csv(tmp_path / "r" / "summary.csv")
    assert set(summary["code_hash"]) == {code_hash()}
    assert set(summary["precision"]) == {"fp32"}
    assert set(summary["device_name"]) == {device_name("cpu")}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Provenance" in md and code_hash() in md and "recorded no provenance" not in md
    # the corpus changed between the cells' runs: the fprop cell trained again on its new tokens
    # (its new run recorded here as a run records it), the baseline on the old ones
    from ablate.study import load_study
    from ablate.tracking import StudyTracker
    from ablate.tracking.vocab import env_tag

    study = load_study(p, output=out)
    base, cell = sorted(study.cells, key=lambda c: not c.baseline)
    tracker = StudyTracker(study.tracking_uri, study.name)
    old = tracker.cell_runs()[cell.key]
    new = tracker.create_cell_run(parent.info.run_id, cell)
    client.log_param(new, "data.fingerprint", "0123456789abcdef")
    tracker.set_raw_tags(new, {k: v for k, v in old.tags.items() if k.startswith(env_tag(""))})
    for name in ("val_loss", "tokens"):
        for m in client.get_metric_history(old.run_id, name):
            client.log_metric(new, name, m.value, step=m.step)
    tracker.set_status(new, "finished")
    base_fp = tracker.cell_runs()[base.key].data["data.fingerprint"]
    report = ["report", str(p), "--runs", str(out), "--no-attach", "-o"]
    res = CliRunner().invoke(main, [*report, str(tmp_path / "d")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert (
        f"(data.corpus builtin: data.fingerprint {base_fp} (`{base.config_label}` seed 0) and "
        f"data.fingerprint 0123456789abcdef (`{cell.config_label}` seed 0))" in res.output
    ), res.output
    assert "--mix-data" in res.output and not (tmp_path / "d").exists()
    res = CliRunner().invoke(main, [*report, str(tmp_path / "d"), "--mix-data"])
    assert res.exit_code == 0, res.output
    assert "compared anyway (--mix-data)" in (tmp_path / "d" / "report.md").read_text()


def test_a_baseline_trained_longer_is_recorded_so_and_read_up_to_the_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = _write(tmp_path, STUDY + "baseline_extend: 0.5\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["run", str(p), "-o", str(out), "--executor", "local", "--quiet"]
    )
    assert res.exit_code == 0, res.output
    from ablate.report.recorded import study_frames
    from ablate.study import load_study
    from ablate.tracking import baseline_curves, read_histories, study_status

    study = load_study(p, output=out)
    statuses = {cs.cell.baseline: cs for cs in study_status(study)}
    base = statuses[True]
    assert base.run is not None and base.run.status == "finished"
    # its MLflow run: the schedule as a param, evaluations up to step 6 (4 + ceil(0.5 x 4))
    from mlflow.tracking import MlflowClient

    from ablate.tracking import default_uri

    params = MlflowClient(tracking_uri=default_uri(out)).get_run(base.run.run_id).data.params
    assert params["train.schedule_steps"] == "4" and params["train.steps"] == "6"
    assert (
        "train.schedule_steps"
        not in MlflowClient(tracking_uri=default_uri(out))
        .get_run(statuses[False].run.run_id)
        .data.params
    )
    hist = read_histories(study.tracking_uri, [base.run.run_id])[base.run.run_id]
    assert [s for s, _ in hist["val_loss"]] == [0, 2, 4, 6]
    # a target derived from the baseline reads its curve up to the budget (step 4)
    (curve,) = baseline_curves(study)
    assert curve.budget == 4 * 4 * 32
    cells, _ = study_frames(study)
    assert cells.set_index("baseline").loc[True, "schedule_steps"] == 4
    md = (tmp_path / "reports" / "clitest" / "report.md").read_text()
    assert "trained 1.50x the budget (baseline_extend)" in md
    assert "**Baseline trained longer**" in md


def test_every_command_has_help_with_an_example():
    for cmd in ("run", "plan", "status", "validate", "schema", "ui", "recipe"):
        res = CliRunner().invoke(main, [cmd, "--help"])
        assert res.exit_code == 0 and "Example:" in res.output, cmd


def test_ui_refuses_a_study_that_has_no_store(tmp_path):
    """A refusal of what the user named, before anything starts: exit 2, as a missing
    --tracking-uri store is (it was 1)."""
    p = _write(tmp_path, STUDY)
    res = CliRunner().invoke(main, ["ui", str(p), "-o", str(tmp_path / "out")])
    db = tmp_path / "out" / "mlflow.db"
    assert res.exit_code == 2 and f"{db}: no MLflow store yet; run `ablate run" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_ui_refuses_a_tracking_uri_it_cannot_show_at_once_and_writes_nothing(tmp_path, monkeypatch):
    """A server that does not answer was asked through MLflow's client (minutes of retries); a
    missing SQLite file, or an empty URI (./mlflow.db), got a new store made by `mlflow server`; a
    damaged one or another scheme, the server's traceback."""
    import time

    monkeypatch.chdir(tmp_path)
    damaged = tmp_path / "damaged.db"
    damaged.write_text("not a database\n")
    cases = {
        "http://127.0.0.1:9": "no MLflow tracking server answers",
        "garbage": "unsupported tracking URI 'garbage'",
        "": "unsupported tracking URI ''",
        f"sqlite:///{tmp_path}/none.db": "no MLflow store at",
        f"sqlite:///{damaged}": "is damaged or not a SQLite database",
    }
    for uri, says in cases.items():
        t0 = time.monotonic()
        res = CliRunner().invoke(main, ["ui", "--tracking-uri", uri, "--study", "x"])
        assert res.exit_code == 2, (uri, res.output)
        assert "--tracking-uri" in res.output and says in res.output, (uri, res.output)
        assert time.monotonic() - t0 < 20, uri
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.db"]
    assert damaged.read_text() == "not a database\n"


def test_ui_refuses_a_timeout_that_is_not_a_positive_number(tmp_path):
    p = _write(tmp_path, STUDY)
    for bad in ("-1", "0", "nan", "inf"):
        res = CliRunner().invoke(main, ["ui", str(p), "--timeout", bad])
        assert res.exit_code == 2 and "--timeout" in res.output, (bad, res.output)


def test_ui_refuses_a_host_it_cannot_listen_on_naming_host_and_why(tmp_path):
    """It said the port was in use (exit 1). Only unresolvable names here: nothing is bound."""
    from ablate.tracking import prepare_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    prepare_store(uri, tmp_path)
    for host in ("999.1.1.1", "no-such-host.invalid"):
        res = CliRunner().invoke(
            main, ["ui", "--tracking-uri", uri, "--study", "x", "--host", host]
        )
        assert res.exit_code == 2 and "--host" in res.output, (host, res.output)
        assert "is not an address or a host name this machine resolves" in res.output, res.output
        assert "in use" not in res.output and "Traceback" not in res.output, res.output


def test_ui_refuses_an_empty_host_which_would_listen_on_every_interface(tmp_path):
    p = _write(tmp_path, STUDY)  # no store: checked before the study is read
    res = CliRunner().invoke(main, ["ui", str(p), "-o", str(tmp_path / "out"), "--host", ""])
    assert res.exit_code == 2 and "--host" in res.output and "an empty address" in res.output


def test_ui_says_a_port_that_is_taken_is_in_use(tmp_path):
    import socket

    from ablate.tracking import prepare_store

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    prepare_store(uri, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        res = CliRunner().invoke(
            main, ["ui", "--tracking-uri", uri, "--study", "x", "--port", port]
        )
    assert res.exit_code == 1 and f"port {port} on 127.0.0.1 is in use" in res.output, res.output


def test_ui_checks_where_the_server_listens_not_getaddrinfos_first_answer(tmp_path):
    """The checks took getaddrinfo's first answer of any family: with `localhost` resolving to ::1
    first, they tested [::1]:5000 while several uvicorn workers bind 127.0.0.1:5000 (IPv4 unless
    the host has a ':') and one worker binds every answer. Nothing is bound past 127.0.0.1."""
    import socket

    from ablate.errors import TrackingError
    from ablate.tracking import prepare_store
    from ablate.tracking.ui import _bind_each, _check_port, listen_addresses, local_url

    # several workers: one IPv4 socket whatever the resolver's order, IPv6 for an IPv6 address
    assert {f for f, _ in listen_addresses("localhost", workers=2)} == {socket.AF_INET}
    assert [f for f, _ in listen_addresses("::1", workers=2)] == [socket.AF_INET6]
    # one worker: every answer, 127.0.0.1 among those of localhost
    assert (socket.AF_INET, ("127.0.0.1", 0)) in listen_addresses("localhost", workers=1)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    prepare_store(uri, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(TrackingError, match=f"port {port} on localhost is in use"):
            _check_port("localhost", port, workers=2)
        res = CliRunner().invoke(
            main,
            [
                "ui",
                "--tracking-uri",
                uri,
                "--study",
                "x",
                "--host",
                "localhost",
                "--port",
                str(port),
            ],
        )
    assert res.exit_code == 1 and f"port {port} on localhost is in use" in res.output, res.output
    # a family this kernel lacks (`--host ::` without IPv6): a refusal, not a traceback
    with pytest.raises(TrackingError, match="cannot make it"):
        _bind_each([(12345, ("::", 0))], 0, lambda e: TrackingError(f"cannot make it ({e})"))
    # the server is waited for, and its URL printed, at an address a client can reach
    assert local_url("::1", 5000) == "http://[::1]:5000"
    assert local_url("::", 5000) == "http://[::1]:5000"  # one worker listens on IPv6 only there
    assert local_url("0.0.0.0", 5000) == "http://127.0.0.1:5000"
    assert local_url("localhost", 5000) == "http://localhost:5000"


def test_ui_checks_the_port_with_the_servers_socket_options():
    """The check bound a plain socket: a port left in TIME_WAIT by a server that just stopped read
    as in use, though the server (SO_REUSEADDR) binds it; and `--host ::` with one worker was
    refused for a port taken on IPv4 only, though asyncio binds `::` IPv6-only."""
    import errno
    import socket

    from ablate.errors import TrackingError
    from ablate.tracking.ui import _check_port

    def listener(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
        s = socket.socket()  # as a server sets it up
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen()
        return s

    with listener() as server:  # a connection the server closes first: its end in TIME_WAIT
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = server.accept()
            conn.close()
            assert client.recv(1) == b""
    with pytest.raises(OSError) as plain, socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the old check's bind
    assert plain.value.errno == errno.EADDRINUSE
    for workers in (1, 2):
        _check_port("127.0.0.1", port, workers=workers)
    with listener(port=port):  # really in use: still refused
        for workers in (1, 2):
            with pytest.raises(TrackingError, match=f"port {port} on 127.0.0.1 is in use"):
                _check_port("127.0.0.1", port, workers=workers)
        try:
            socket.socket(socket.AF_INET6).close()
        except OSError:
            return  # no IPv6 here
        _check_port("::", port, workers=1)  # asyncio's `::`: IPv6 only
        if Path("/proc/sys/net/ipv6/bindv6only").read_text().strip() == "0":
            with pytest.raises(TrackingError, match="is in use"):  # uvicorn's: dual stack
                _check_port("::", port, workers=2)


def test_report_without_a_store_or_runs_says_so_and_fails(tmp_path):
    p = _write(tmp_path, STUDY)
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(tmp_path / "out")])
    assert res.exit_code == 2 and "no MLflow store" in res.output, res.output
    res = CliRunner().invoke(
        main, ["report", "--tracking-uri", f"sqlite:///{tmp_path}/none.db", "--study", "x"]
    )
    assert res.exit_code == 2 and "no MLflow store" in res.output, res.output
    assert not (tmp_path / "none.db").exists()
    # a store with the study's runs created but none finished
    from ablate.driver.runner import run_study
    from ablate.study import load_study

    s = load_study(p, output=tmp_path / "out")
    run_study(s, executor="local", progress=False, stop_after=1)
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(tmp_path / "out")])
    assert res.exit_code == 1 and "no finished runs yet" in res.output, res.output


def test_native_backend_on_a_machine_without_the_hardware_fails_before_any_cell_starts(tmp_path):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("checks the refusal on a machine without a GPU")
    # device: cpu: a native cell on auto needs a GPU (resources.gpus, test_devices.py)
    study = STUDY.replace("  train:", "  backend: native\n  device: cpu\n  train:").replace(
        "[[], [fprop]]", "[[], [fprop, dgrad, wgrad]]"
    )
    p = _write(tmp_path, study)
    out = tmp_path / "out"
    for cmd in ("validate", "plan", "run"):  # run's default executor: refused before Ray starts
        res = CliRunner().invoke(main, [cmd, str(p), "-o", str(out)])
        assert res.exit_code == 2, (cmd, res.output)  # refused before anything starts: status 2
        msg = res.output
        assert "backend native cannot run recipe" in msg and "on cpu" in msg, msg
        assert "mxfp4 (fprop, dgrad, wgrad) has no native GEMM on this device" in msg
        assert "cpu runs natively: fp8_e4m3, fp8_e5m2" in msg and "Use `backend: emulated`" in msg
        assert "cells mxfp4[fprop,dgrad,wgrad]/bf16:\n" in msg  # not the bf16 cell: it needs none
    assert not out.exists()


def test_every_command_that_reads_the_store_takes_tracking_uri(tmp_path, monkeypatch):
    """A study tracked in a store other than its default one: plan, status, validate and report
    read it with --tracking-uri (plan then skips the finished cells instead of rerunning them)."""
    monkeypatch.chdir(tmp_path)
    p = _write(tmp_path, STUDY)
    out = tmp_path / "out"
    uri = f"sqlite:///{tmp_path}/elsewhere/store.db"
    (tmp_path / "elsewhere").mkdir()
    run = ["run", str(p), "-o", str(out), "--executor", "local", "--quiet", "--no-report"]
    res = CliRunner().invoke(main, [*run, "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    assert not (out / "mlflow.db").exists()
    at = ["-o", str(out), "--tracking-uri", uri]
    res = CliRunner().invoke(main, ["plan", str(p), *at, "--json"])
    assert res.exit_code == 0, res.output
    assert [c["action"] for c in json.loads(res.stdout)["cells"]] == ["skip", "skip"]
    res = CliRunner().invoke(main, ["plan", str(p), "-o", str(out)])  # the default store: none
    assert "would: run 2" in res.output, res.output
    res = CliRunner().invoke(main, ["status", str(p), *at, "--json"])
    assert [r["status"] for r in json.loads(res.stdout)["cells"]] == ["finished", "finished"]
    res = CliRunner().invoke(main, ["validate", str(p), *at])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(out), "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    for cmd in ("run", "plan", "status", "validate", "report", "ui", "adopt", "probe", "tune"):
        res = CliRunner().invoke(main, [cmd, "--help"])
        assert "--tracking-uri" in res.output, cmd
    # the hint of a reader that finds no store names an option the command has
    res = CliRunner().invoke(main, ["report", str(p), "--runs", str(tmp_path / "none")])
    assert "--tracking-uri" in res.output, res.output


def test_a_file_store_on_a_cluster_ablate_did_not_start_is_refused_before_connecting(
    tmp_path, monkeypatch
):
    """Whatever the cluster's node count (one now; an autoscaler adds more), a SQLite store on
    this machine is refused for --address / RAY_ADDRESS, at once, naming the fix."""
    import time

    from ablate.executor import remote_cluster

    p = _write(tmp_path, STUDY)
    out = tmp_path / "out"
    elsewhere = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    for cmd, extra in [
        ("run", ["--address", "ray://nowhere:10001"]),
        ("run", ["--address", "10.255.255.1:6379", "--tracking-uri", elsewhere]),
        ("validate", ["--address", "ray://nowhere:10001"]),
        ("plan", ["--address", "ray://nowhere:10001"]),
        ("run", []),  # RAY_ADDRESS below
    ]:
        env = {"RAY_ADDRESS": "ray://nowhere:10001"} if not extra else {}
        t0 = time.perf_counter()
        res = CliRunner().invoke(main, [cmd, str(p), "-o", str(out), *extra], env=env)
        assert time.perf_counter() - t0 < 10, cmd  # no attempt to reach the cluster
        assert res.exit_code == 2, (cmd, extra, res.output)
        assert "is a file on this machine" in res.output and "names a Ray cluster" in res.output
        assert "mlflow server" in res.output and "--tracking-uri http://<host>:5000" in res.output
    assert not out.exists() and not (tmp_path / "elsewhere").exists()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not remote_cluster(None) and not remote_cluster("local")
    assert remote_cluster("ray://head:10001") and remote_cluster("127.0.0.1:6379")


# what an `ablate` process imports before it runs a command: each of these costs seconds of CPU at
# every start on a slow machine (Dynamo 2 s; MLflow 3 s), and the commands that need one import it
NOT_AT_START = (
    "torch", "mlflow", "ray", "optuna", "pandas", "matplotlib",
)  # fmt: skip


def test_the_cli_starts_without_the_libraries_only_some_commands_need():
    code = "import sys, ablate.cli, backends; print(sorted(set(sys.argv[1:]) & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code, *NOT_AT_START], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_commands_that_train_nothing_leave_the_libraries_they_do_not_need_unimported(tmp_path):
    # a study's schema, recipes and operands are plain Python (torch: 1.3-2 s of CPU a start), so
    # these commands run without torch; validate and plan ask this machine's devices (torch), and
    # the store for the baseline's recorded curves (the target's headroom): a study that has
    # recorded nothing has no store file, which is known without MLflow (3-5 s of CPU a start)
    study = tmp_path / "quickstart.yaml"
    study.write_text((Path(__file__).parents[3] / "studies" / "quickstart.yaml").read_text())
    code = (
        "import sys; from ablate.cli import main\n"
        "def ok(args):\n"
        "    try: main(args)\n"
        "    except SystemExit as e: assert e.code == 0, (args, e.code)\n"
        "for args in (['--help'], ['status', 'quickstart.yaml'], ['recipe', 'nvidia_nvfp4'],\n"
        "             ['slurm', 'submit', 'quickstart.yaml', '--nodes', '2', '--time', '30',\n"
        "              '--dry-run'], ['schema']):\n"
        "    ok(args)\n"
        "print('torch-free:', sorted({'torch', 'mlflow'} & set(sys.modules)))\n"
        "for cmd in ('validate', 'plan'): ok([cmd, 'quickstart.yaml'])\n"
        "print('mlflow-free:', sorted({'mlflow', 'pandas'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "slurm run" in out.stdout  # the job's script
    assert "torch-free: []" in lines, out.stdout[-3000:]
    after = lines[lines.index("torch-free: []") + 1 :]
    assert after[0].startswith("ok: quickstart: 18 cells"), after[:3]
    assert after[-1] == "mlflow-free: []", out.stdout[-3000:]
    assert not any(tmp_path.glob("**/*.db"))  # and nothing created


def test_the_quickstarts_report_folder_is_one_report_accepts(monkeypatch):
    """`make quickstart` writes its report into a folder of its own in the study's output folder
    (leaving the clone's kept report as it is): a place `-o` allows, unlike the output folder
    itself or the folders of its records."""
    import re
    import shlex

    from ablate.report.study import report_folder
    from ablate.study import load_study

    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(root)
    (line,) = re.findall(
        r"ablate report (studies/quickstart\.yaml .*)", (root / "Makefile").read_text()
    )
    args = shlex.split(line)
    study = load_study(args[0])
    out = args[args.index("-o") + 1]
    assert Path(out).resolve().parent == study.output_dir.resolve()
    assert report_folder(study, out) == Path(out)
