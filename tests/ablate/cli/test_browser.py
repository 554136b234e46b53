"""What a person sees, in a real headless Chromium (Debian's, driven by Playwright): the report's
HTML and ``ablate ui`` on a finished study. Slow (a study, an MLflow server, a browser); CI installs
Chromium (``.ci/run``) and fails here without it, a developer's machine without it skips.

Set ``ABLATE_SCREENSHOTS=<folder>`` to keep screenshots of what the tests looked at.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ablate.tracking.ui import descendants

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("ABLATE_SCREENSHOTS")

STUDY = """
name: browser
description: a two-configuration study for the browser tests
base:
  model: {{preset: tiny}}
  data: {{val_tokens: 2048}}
  train: {{steps: 8, batch_size: 4, seq_len: 32, eval_every: 4, warmup_steps: 1, eval_batches: 4}}
  base_format: fp8
grid:
  - {{seed: [0, 1]}}
  - {{fp4_gemms: [[fprop, dgrad, wgrad]], intervention: [dht16], seed: [0, 1]}}
baseline: {{fp4_gemms: []}}
target: {{from_baseline: final, tolerance: 0.5}}
output: {out}
"""


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser tests: no chromium on PATH (.ci/run installs it)")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished study with its report (run and reported by the CLI, as a user would)."""
    root = tmp_path_factory.mktemp("browser")
    path = root / "browser.yaml"
    path.write_text(STUDY.format(out=root / "out"))
    cmd = [sys.executable, "-m", "ablate.cli"]
    subprocess.run([*cmd, "run", str(path), "--executor", "local", "--quiet"], check=True, cwd=root)
    return root, path


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def test_report_html_loads_everything_from_itself_and_fits_1000_px(browser, study):
    root, _ = study
    report = root / "reports" / "browser" / "report.html"
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
    assert len(images) == 5 and all(done and width > 0 for done, width in images)
    # the page never scrolls sideways; a wide table scrolls inside its own box
    assert page.evaluate("document.documentElement.scrollWidth") <= 1000
    wraps = page.eval_on_selector_all(
        ".table-wrap", "els => els.map(e => getComputedStyle(e).overflowX)"
    )
    assert wraps and set(wraps) == {"auto"}
    text = page.inner_text("body")
    assert "Verdict" in text.split("Summary")[0]
    assert not re.search(r"\*\S[^*]*\S\*", text), "literal Markdown emphasis in the page"
    _shot(page, "report")
    page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ui(study):
    """``ablate ui`` on the finished study: (its printed URL, seconds to it, the process)."""
    root, path = study
    port = _free_port()
    cmd = [sys.executable, "-m", "ablate.cli", "ui", str(path), "--port", str(port)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url = None
    for line in proc.stderr:
        if line.startswith("MLflow UI: "):
            url = line.split()[2]
            break
    assert url is not None, "ablate ui printed no URL"
    yield url, time.monotonic() - start, proc
    server = descendants(proc.pid)
    proc.terminate()  # as a supervisor or a closed terminal would: the server goes with it
    proc.wait(30)
    time.sleep(1)
    alive = [cmd for pid, cmd in server if Path(f"/proc/{pid}").exists()]
    for pid, _ in server:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert alive == [], "the MLflow server outlived `ablate ui`"


def test_ui_answers_with_one_worker_and_no_job_runner(ui):
    url, seconds, proc = ui
    assert url.endswith("/runs?viewStateShareKey=ablate&workflowType=machine_learning")
    assert seconds < 60
    commands = [cmd for _, cmd in descendants(proc.pid)]
    assert commands and not [c for c in commands if "huey" in c]
    assert [c for c in commands if "mlflow server" in c and "--workers 1" in c]


def test_ui_opens_the_cells_with_their_summary_metrics(browser, ui, study):
    url, _, _ = ui
    page = browser.new_page(viewport={"width": 2400, "height": 900})
    page.goto(url)
    page.get_by_text("dht16·fdw/fp8·s1").wait_for(timeout=60_000)
    page.get_by_text("final_val_ppl").first.wait_for(timeout=30_000)
    _shot(page, "runs_table")
    text = page.inner_text("body")
    names = ["fp8·s0", "fp8·s1", "dht16·fdw/fp8·s0", "dht16·fdw/fp8·s1"]
    assert all(n in text for n in names)
    assert "4 matching runs" in text  # the cells, not the parent
    for column in ("final_val_ppl", "tokens_to_target", "intervention"):
        assert column in text, column
    page.close()


def test_a_run_page_shows_the_axes_as_params(browser, ui):
    from mlflow.tracking import MlflowClient

    url, _, _ = ui
    root = url.split("/#/")[0]
    eid = re.search(r"experiments/(\d+)/", url)[1]
    client = MlflowClient(tracking_uri=root)
    (run,) = client.search_runs([eid], "attributes.run_name = 'dht16·fdw/fp8·s1'")
    assert run.data.params["intervention"] == "dht16"
    assert run.data.params["fp4_gemms"] == "fprop+dgrad+wgrad"
    assert run.data.tags["ablate.label"] == "mxfp4[fprop,dgrad,wgrad]+dht16/fp8/seed1"
    assert "final_val_ppl" in run.data.metrics and "reached" in run.data.metrics
    assert not [k for k, v in run.data.params.items() if v == "None"]
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(f"{root}/#/experiments/{eid}/runs/{run.info.run_id}?workflowType=machine_learning")
    page.get_by_text("intervention").first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    assert "dht16" in text and "fprop+dgrad+wgrad" in text
    _shot(page, "run_page")
    page.close()


def test_ui_on_a_tracking_server_links_to_it_instead_of_starting_one(ui):
    url, _, _ = ui
    root = url.split("/#/")[0]
    cmd = [sys.executable, "-m", "ablate.cli", "ui", "--tracking-uri", root, "--study", "browser"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == url


def test_ui_charts_validation_against_tokens(browser, ui):
    url, _, _ = ui
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(url + "&compareRunsMode=CHART")
    search = page.get_by_placeholder("Search metric charts")
    search.wait_for(timeout=60_000)
    search.fill("val_ppl_by_tokens")
    page.get_by_text("val_ppl_by_tokens").first.wait_for(timeout=60_000)
    page.wait_for_timeout(2000)
    _shot(page, "charts")
    text = page.inner_text("body")
    # every cell is charted (MLflow's default shows the first ten), the parent is not listed
    assert "4 matching runs" in text and "Unhide run" not in text
    page.close()
