"""A study tracked by a real ``mlflow server`` (its own SQLite store, ``--artifacts-destination``)
on a free loopback port: the artifacts go through the server into its destination, not into a
folder on the driver; a baseline seed reused in turn from a study that had reused it names, and
exports from, the study it trained in."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_runner import tiny_study

from ablate.driver.runner import run_study
from ablate.export import export_cell
from ablate.study import load_study
from ablate.tracking.server import server_command
from ablate.tracking.store import prepare_served_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[tuple[str, Path]]:
    """A real ``mlflow server`` (one worker, job execution off) on a free loopback port, its store
    ``root/server.db`` made as ``ablate slurm run`` makes its server's (``prepare_served_store``),
    and its artifacts destination ``root/served``; yields (its URI, the destination). Stopped by
    ending its own process group."""
    prepare_served_store(f"sqlite:///{root / 'server.db'}")
    port = _free_port()
    served = root / "served"
    cmd, env = server_command(
        f"sqlite:///{root / 'server.db'}", "127.0.0.1", port,
        extra=["--artifacts-destination", str(served)],
    )  # fmt: skip
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the MLflow server did not answer in 120 s"
            with contextlib.suppress(OSError):
                urllib.request.urlopen(uri + "/health", timeout=2).close()
                break
            time.sleep(0.25)
        yield uri, served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    with mlflow_server(tmp_path_factory.mktemp("server")) as found:
        yield found


@pytest.mark.slow
def test_artifacts_of_a_server_tracked_study_land_in_the_servers_destination(
    server, tmp_path, monkeypatch
):
    uri, served = server
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory either
    study = tiny_study(tmp_path, steps=2, seed=[0])
    study.file.tracking.uri = uri
    res = run_study(study, executor="local", progress=False)
    assert [o.status for o in res.outcomes.values()] == ["finished"]

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp is not None and exp.artifact_location.startswith("mlflow-artifacts:/")
    cell = res.run_ids[study.cells[0].key]
    # on the server's disk, under its destination: <experiment>/<run>/artifacts/...
    config = served / exp.experiment_id / cell / "artifacts" / "config.json"
    assert config.is_file() and '"steps": 2' in config.read_text()
    spec = served / exp.experiment_id / res.parent_run_id / "artifacts" / "study.yaml"
    assert spec.read_text() == "# test study\n"
    assert not (study.output_dir / "artifacts").exists()
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlartifacts").exists()
    # and read back through the server, as `report` reads the study's text
    from ablate.tracking import read_study_text

    assert read_study_text(uri, study.name) == "# test study\n"


@pytest.mark.slow
def test_a_served_store_made_from_the_template_is_served_without_migrations(server):
    # made as `ablate slurm run` makes its server's store: MLflow finds its schema current and
    # creates no tables; the default experiment's artifacts are where the server puts them
    uri, served = server
    log = (served.parent / "server.log").read_text()
    assert "Uvicorn running" in log and "Creating initial MLflow database tables" not in log, log
    default = MlflowClient(tracking_uri=uri).get_experiment("0")
    assert default.name == "Default" and default.artifact_location == "mlflow-artifacts:/0"


@pytest.mark.slow
def test_the_driver_lock_works_through_the_server(server):
    from ablate.errors import RunnerError
    from ablate.tracking import StudyTracker

    uri, _ = server
    tracker = StudyTracker(uri, "locked")
    with tracker.driver_lock("run", command="ablate run", output="/runs/a", error=RunnerError):
        with pytest.raises(RunnerError, match="output folder /runs/a, since"):
            tracker.driver_lock(
                "run", command="ablate run", output="/runs/b", error=RunnerError
            ).acquire()
        assert [h.output for h in tracker.drivers("run")] == ["/runs/a"]
    assert tracker.drivers("run") == []
    tags = MlflowClient(tracking_uri=uri).get_experiment(tracker.experiment_id).tags
    assert not [k for k in tags if k.startswith("ablate.driver.")]  # deleted through the server


def test_a_tracking_server_on_an_ipv6_address_is_reached_in_brackets(tmp_path):
    """Its URL was http://::1:5000 (which urllib and MLflow's client cannot parse), and it allowed
    the Host header ::1:5000, which no client sends. Nothing is started here."""
    import urllib.parse

    from ablate.tracking.server import TrackingServer

    for host, netloc in [
        ("::1", "[::1]:5000"),
        ("fd00::7", "[fd00::7]:5000"),
        ("10.0.0.1", "10.0.0.1:5000"),
        ("node-1", "node-1:5000"),
    ]:
        server = TrackingServer(
            "sqlite:///x.db", host=host, port=5000, artifacts_destination=tmp_path, log=tmp_path
        )
        assert server.url == f"http://{netloc}" and urllib.parse.urlsplit(server.url).port == 5000
        cmd, _ = server.command()
        assert cmd[cmd.index("--host") + 1] == host  # listens at the address as given
        allowed = cmd[cmd.index("--allowed-hosts") + 1].split(",")
        assert netloc in allowed, allowed  # the Host a client of url sends (MLflow: equal to one)


REUSED = """name: {name}
base:
  model: {{preset: tiny}}
  data: {{val_tokens: 4096}}
  train: {{steps: 2, batch_size: 4, seq_len: 32, eval_every: 2, warmup_steps: 1}}
grid: {{fp4_gemms: [[]]}}
baseline: {{fp4_gemms: []}}
tracking: {{uri: '{uri}'}}
output: {name}
"""


@pytest.mark.slow
def test_a_seed_reused_from_a_study_that_reused_it_names_and_exports_where_it_trained(
    server, tmp_path, monkeypatch
):
    """``mid`` reuses ``src``'s baseline seed and ``end`` reuses ``mid``'s copy, all on the server.
    The copy in ``end`` was tagged as reused from ``mid``, which never trained it: its export
    looked for a checkpoint in ``mid``'s folder only (a server's URI names no folder) and was
    refused, naming ``mid`` as where it trained."""
    uri, _ = server
    monkeypatch.chdir(tmp_path)  # baseline_from's paths are relative to it
    studies = {}
    for name, source in (("src", None), ("mid", "src"), ("end", "mid")):
        text = REUSED.format(name=name, uri=uri) + (
            f"baseline_from: {source}.yaml\n" if source else ""
        )
        (tmp_path / f"{name}.yaml").write_text(text)
        studies[name] = load_study(tmp_path / f"{name}.yaml")
        res = run_study(studies[name], executor="local", progress=False)
        assert [o.status for o in res.outcomes.values()] == (["finished"] if not source else [])
    (cell,) = studies["src"].cells
    trained = MlflowClient(tracking_uri=uri)
    runs = {n: {r.data.tags["ablate.key"]: r for r in trained.search_runs(
        [trained.get_experiment_by_name(n).experiment_id], "tags.`ablate.role` = 'cell'")}[cell.key]
        for n in studies}  # fmt: skip
    for name in ("mid", "end"):
        tags = runs[name].data.tags
        assert tags["ablate.reused_from"] == f"study src in {uri}", name
        assert tags["ablate.reused_run"] == runs["src"].info.run_id, name
    got = export_cell(studies["end"], cell.label, tmp_path / "exported")
    want = export_cell(studies["src"], cell.label, tmp_path / "theirs")
    assert (got / "model.safetensors").read_bytes() == (want / "model.safetensors").read_bytes()
