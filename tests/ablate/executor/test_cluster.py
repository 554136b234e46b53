"""Ablate next to a Ray cluster started with `ray start` on this machine (Ray 2.60 turns token
authentication on for it): a plain `ablate run` starts its own Ray, and `--address` to the cluster
without the token is named an authentication problem within seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import STUDY as CLI_STUDY

from ablate.cli import main
from ablate.errors import RunnerError
from ablate.tracking.store import prepare_served_store

STUDY = CLI_STUDY.replace("[[], [fprop]]", "[[]]")  # one cell
FSDP_STUDY = STUDY.replace("warmup_steps: 1}", "warmup_steps: 1, parallel: fsdp}")
assert FSDP_STUDY != STUDY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_of(marks: tuple[str, ...]) -> set[int]:
    """Processes whose command line holds one of ``marks``, and their descendants."""
    found: set[int] = set()
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(d.name)] = ppid
        if any(m in cmd for m in marks):
            found.add(int(d.name))
    grew = True
    while grew:
        more = {p for p, pp in parents.items() if pp in found} - found
        found |= more
        grew = bool(more)
    return found


@pytest.fixture(scope="module")
def ray_start_head():
    """A head started with `ray start` (token authentication on); its address. Stopped by killing
    its own processes (found by its ports), not `ray stop`, which would stop every Ray here."""
    exe = Path(sys.executable).parent / "ray"
    gcs, client, dash = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    address_file = Path("/tmp/ray/ray_current_cluster")
    before = address_file.read_text() if address_file.exists() else None
    marks = (f"--gcs_server_port={gcs}", f":{gcs} ", f"port={client} ")
    try:
        subprocess.run(
            [str(exe), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
             f"--ray-client-server-port={client}", f"--dashboard-port={dash}", "--num-cpus=1",
             "--include-dashboard=false", "--disable-usage-stats"],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        address = address_file.read_text().strip()
        assert address.endswith(f":{gcs}"), address
        yield address
    finally:
        pids = _pids_of(marks)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(2)
        if address_file.exists() and address_file.read_text().strip().endswith(f":{gcs}"):
            if before is None:
                address_file.unlink()
            else:
                address_file.write_text(before)


@pytest.mark.slow
def test_a_plain_run_beside_a_ray_start_cluster_starts_its_own_ray(
    tmp_path, monkeypatch, ray_start_head
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # ray.init sets it for its own Ray
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.yaml"
    p.write_text(STUDY)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", str(p), "-o", str(out), "--quiet", "--no-report"])
    assert res.exit_code == 0, res.output
    assert "object_store_memory" not in res.output and "Traceback" not in res.output
    assert f"a Ray cluster started with `ray start` runs on this machine ({ray_start_head})" in (
        res.output
    )
    assert f"pass --address {ray_start_head}" in res.output
    res = CliRunner().invoke(main, ["status", str(p), "-o", str(out), "--json"])
    assert '"status": "finished"' in res.output, res.output


@pytest.mark.slow
def test_address_of_a_token_cluster_without_the_token_mode_is_an_authentication_error(
    monkeypatch, ray_start_head
):
    """Ray's own ray.init retries for 20 s and then says it cannot connect."""
    from ablate.executor import RayExecutor, check_ray_auth

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    t0 = time.perf_counter()
    with pytest.raises(RunnerError) as e:
        RayExecutor(address=ray_start_head)
    assert time.perf_counter() - t0 < 10
    msg = str(e.value)
    assert f"--address {ray_start_head}: the Ray cluster has token authentication on" in msg
    assert "RAY_AUTH_MODE=token" in msg and "RAY_AUTH_TOKEN" in msg and "auth_token" in msg
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    check_ray_auth(ray_start_head)  # the token `ray start` wrote in ~/.ray/auth_token: taken


@pytest.mark.slow
def test_a_wrong_or_missing_token_is_named_as_such(tmp_path, ray_start_head):
    """In fresh processes: Ray loads its token once per process."""
    code = (
        "import sys\n"
        "from ablate.errors import RunnerError\n"
        "from ablate.executor import check_ray_auth\n"
        "try:\n"
        f"    check_ray_auth({ray_start_head!r})\n"
        "except RunnerError as e:\n"
        "    sys.exit(str(e))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base["RAY_AUTH_MODE"] = "token"
    for env, says in [
        ({"RAY_AUTH_TOKEN": "not-the-token"}, "refuses this process's token"),
        ({"HOME": str(tmp_path)}, "this process has no token"),  # no ~/.ray/auth_token
    ]:
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True
        )
        assert time.perf_counter() - t0 < 20
        assert res.returncode == 1 and says in res.stderr, (env, res.stderr[-2000:])
        assert "RAY_AUTH_TOKEN" in res.stderr and "ray get-auth-token" in res.stderr


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` (SQLite backend, an artifacts destination) on a free loopback port;
    its URI. Stopped with its process group. Its job execution is off, as in ablate's own
    servers: ablate runs no MLflow jobs, and the job runner's seven consumer processes took 31 s
    of the suite's CPU. Its store made as ablate's own servers' are (``prepare_served_store``:
    MLflow finds it migrated)."""
    prepare_served_store(f"sqlite:///{tmp_path}/server.db")
    port = _free_port()
    exe = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(exe), "server", "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
         "--artifacts-destination", str(tmp_path / "server-artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("mlflow server did not start") from None
                time.sleep(0.5)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_two_worker_cell_spans_a_two_node_cluster_tracked_by_a_server(
    tmp_path, ray_start_head, mlflow_server
):
    """`ray start` head + a second node (`ray start --address`, token authentication) on loopback,
    1 CPU each; a cell of resources.workers: 2 x 1 CPU can only run with one worker per node: FSDP
    over gloo between the two nodes, logged through the tracking server, every metric step once,
    every evaluation bit-identical to the same run in two gloo processes on one host."""
    from mlflow.tracking import MlflowClient
    from test_distributed_ray import assert_logged_once, uninterrupted_evals

    from ablate.study import load_study

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
    exe = Path(sys.executable).parent / "ray"
    subprocess.run(
        [
            str(exe),
            "start",
            f"--address={ray_start_head}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            "--disable-usage-stats",
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip  (stopped with the head's processes: they name its GCS port)
    p = tmp_path / "s.yaml"
    p.write_text(FSDP_STUDY + "resources: {cpus: 1, workers: 2}\n")
    out = tmp_path / "out"
    # in a process of its own, as a user runs it: Ray reads RAY_AUTH_MODE once per process
    args = ["run", str(p), "-o", str(out), "--address", ray_start_head]
    res = subprocess.run(
        [str(Path(sys.executable).parent / "ablate"), *args, "--tracking-uri", mlflow_server,
         "--no-report", "--quiet"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_server)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`ablate.role` = 'cell'"
    )
    assert len(runs) == 1
    assert runs[0].data.params["train.parallel"] == "fsdp"
    assert runs[0].data.tags["ablate.resumed_from"] in ("", "0")  # never interrupted
    (cell,) = load_study(p, output=out).cells  # as `ablate run` read it
    train = cell.config.train
    assert_logged_once(mlflow_server, runs[0], train.steps, eval_every=train.eval_every)
    history = client.get_metric_history(runs[0].info.run_id, "val_loss")
    got = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert got == uninterrupted_evals(cell)
    # the artifacts went through the server into its destination, not into the output folder
    assert [p.parent.parent.name for p in (tmp_path / "server-artifacts").rglob("config.json")] == [
        runs[0].info.run_id
    ]
    assert not (out / "artifacts").exists()
