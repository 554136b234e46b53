"""Screenshots of what a person sees of a finished study, for the README and the report folder:
``python tests/ablate/cli/screenshots.py studies/quickstart.yaml reports/quickstart/screenshots``.

Starts ``ablate ui`` on the study, opens its runs table, one run's page and the comparison chart of
validation against tokens in headless Chromium (Debian's, via Playwright, as the browser tests do),
and the study's ``report.html``; writes runs_table.png, run_page.png, charts.png and report.png.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

VIEW = {"width": 1440, "height": 900}


def main(study_file: str, out: str) -> None:
    from playwright.sync_api import sync_playwright

    from ablate.study import load_study

    study = load_study(study_file)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ablate.cli", "ui", study_file, "--port", "5093"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    url = next(line.split()[2] for line in proc.stderr if line.startswith("MLflow UI: "))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport=VIEW)
            page.goto(url)
            page.get_by_text("final_val_ppl").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out_dir / "runs_table.png"))

            page.goto(url + "&compareRunsMode=CHART")
            search = page.get_by_placeholder("Search metric charts")
            search.wait_for(timeout=60_000)
            search.fill("val_ppl")
            page.get_by_text("val_ppl_by_tokens").first.wait_for(timeout=60_000)
            page.wait_for_timeout(2500)
            page.screenshot(path=str(out_dir / "charts.png"))

            page.goto(url)
            from ablate.report.waves import asked_part
            from ablate.tracking.vocab import short_name

            cell = asked_part(study).cells[-1]  # a cell with a run (not a seed no wave asked for)

            page.get_by_text(short_name(cell)).first.click()
            page.get_by_text("About this run").wait_for(timeout=60_000)
            page.goto(page.url.split("?")[0] + "?workflowType=machine_learning")
            page.get_by_text("About this run").wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out_dir / "run_page.png"))

            report = Path("reports") / study.name / "report.html"
            page.goto(report.resolve().as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(out_dir / "report.png"))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    for name in ("runs_table", "charts", "run_page", "report"):
        print(out_dir / f"{name}.png")


if __name__ == "__main__":
    main(*sys.argv[1:3])
