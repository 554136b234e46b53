"""The kept reports under ``reports/`` are of the code that ships: each configuration's runs are of
this code's numerics version, from a committed tree (no "dirty" in the provenance), and every study
that has a kept report still validates. A numerics bump fails this test until the reports are
regenerated (docs/development.md, "Numerics versions")."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from ablate.numerics import NUMERICS_VERSION

ROOT = Path(__file__).resolve().parents[1]
KEPT = sorted(p.parent for p in (ROOT / "reports").glob("*/summary.csv"))


def test_the_kept_reports_are_found():
    names = {p.name for p in KEPT}
    assert {"quickstart", "recipes", "heldout", "probes", "qwen3_mxfp4_wgrad"} <= names


@pytest.mark.parametrize("report", KEPT, ids=[p.name for p in KEPT])
def test_a_kept_report_is_of_this_numerics_version_and_a_clean_tree(report: Path):
    rows = list(csv.DictReader((report / "summary.csv").open()))
    assert rows
    versions = {r["numerics"] for r in rows}
    assert versions == {str(NUMERICS_VERSION)}, (
        f"reports/{report.name} holds runs of numerics {sorted(versions)}, the code is "
        f"{NUMERICS_VERSION}: regenerate it (ablate run studies/{report.name}.yaml from a clean "
        "checkout) in the commit that bumped the version"
    )
    # each configuration's runs by the commits that trained them (several where a study resumed
    # across commits), each a commit, never a tree with changes
    assert all(re.fullmatch(r"[0-9a-f]{40}(; [0-9a-f]{40})*", r["git_commit"]) for r in rows)
    md = (report / "report.md").read_text()
    assert "## Provenance" in md or "| runs | numerics |" in md
    assert "(dirty)" not in md, f"reports/{report.name} was made from a tree with changes"
    assert (ROOT / "studies" / f"{report.name}.yaml").is_file()
