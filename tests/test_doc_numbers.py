"""What the README and the docs say of the kept reports comes from those reports: the README's
quickstart paragraph is made from ``reports/quickstart/report.md`` alone, and every percent interval
a page quotes is in a kept report (or marked as history)."""

from __future__ import annotations

import re

from test_docs import PAGES, ROOT

# --- what the README says of the kept quickstart report ----------------------------------------

VERDICT_OPEN = "<!-- quickstart-verdict: generated from reports/quickstart/report.md; checked by tests/test_docs.py -->"
VERDICT_CLOSE = "<!-- /quickstart-verdict -->"


def _summary_rows(report_md: str) -> list[dict[str, str]]:
    """The rows of the report's summary table, by column name."""
    lines = report_md[report_md.index("## Summary") :].splitlines()
    table = [ln for ln in lines[1:] if ln.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = []
    for ln in table[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(head):
            break
        rows.append(dict(zip(head, cells, strict=True)))
    return rows


def quickstart_paragraph(report_md: str) -> str:
    """The README's paragraph on the kept quickstart report, made from that report alone."""
    rows = _summary_rows(report_md)
    base = next(r for r in rows if "(baseline)" in r["configuration"])
    others = [r for r in rows if r is not base]
    by: dict[str, list[str]] = {}
    for r in others:
        by.setdefault(r["verdict"], []).append(r["configuration"])
    order = ["better", "indistinguishable", "worse", "undetermined"]
    words = {
        "better": "*faster*",
        "indistinguishable": "*indistinguishable*",
        "worse": "*slower*",
        "undetermined": "*undetermined*",
    }
    if len(by) == 1:
        (verdict,) = by
        called = f"every configuration {words[verdict]}"
    else:
        called = "; ".join(
            f"{words[v]}: " + ", ".join(f"`{c}`" for c in by[v]) for v in order if v in by
        )
    partial = [
        r for r in others if "partial" in r["seeds reached"] or r["seeds reached"].startswith("0/")
    ]
    seeds = re.search(r"\*\*Seeds\*\*: (.*?)\(from the seed noise", report_md)
    ppl = [float(r["final ppl"].split(" ± ")[0]) for r in others]
    text = (
        f"The kept report calls {called} against the FP8 baseline. {seeds.group(1).strip() + '.' if seeds else ''} "
        f"The baseline's two seeds end at mean perplexity {base['final ppl']}; the other "
        f"configurations' means lie between {min(ppl):g} and {max(ppl):g}"
    )
    if partial:
        text += ", and " + ", ".join(
            f"`{r['configuration']}` reached the target with {r['seeds reached'].split()[0]} seeds"
            for r in partial
        )
    return text + "."


def test_the_readmes_quickstart_paragraph_is_the_kept_reports():
    report = (ROOT / "reports" / "quickstart" / "report.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert VERDICT_OPEN in readme and VERDICT_CLOSE in readme
    said = readme[readme.index(VERDICT_OPEN) + len(VERDICT_OPEN) : readme.index(VERDICT_CLOSE)]
    want = quickstart_paragraph(report)
    assert " ".join(said.split()) == " ".join(want.split()), (
        f"README.md's quickstart paragraph is not what reports/quickstart/report.md says; "
        f"replace it with:\n{want}"
    )


# --- intervals quoted from kept reports ----------------------------------------------------------

INTERVAL = re.compile(r"[+-]?\d+\.\d+% \[[+-]?\d+\.\d+%, [+-]?\d+\.\d+%\]")
HISTORY = re.compile(r"<!-- history -->.*?<!-- /history -->", re.S)


def quoted_intervals(text: str) -> list[str]:
    """The percent intervals a page quotes (``+8.9% [-64.6%, +235.2%]``), outside the blocks it
    marks as history (``<!-- history -->`` ... ``<!-- /history -->``: numbers of runs no report
    keeps, said as such)."""
    return INTERVAL.findall(HISTORY.sub("", text))


def test_every_interval_the_pages_quote_is_in_a_kept_report():
    kept = " ".join(p.read_text() for p in (ROOT / "reports").glob("*/report.md"))
    stale = {
        f"{page.relative_to(ROOT)}: {iv}"
        for page in PAGES
        for iv in quoted_intervals(page.read_text())
        if iv not in kept
    }
    assert not stale, (
        "these intervals are in no kept report (regenerated since?); quote the report as it is, "
        "or mark a past run's numbers <!-- history -->: " + "; ".join(sorted(stale))
    )


def test_the_interval_check_sees_a_stale_quote_and_skips_history():
    page = (
        "cost +1.0% [-2.0%, +3.0%]\n<!-- history -->\nthen +4.0% [-5.0%, +6.0%]\n<!-- /history -->"
    )
    assert quoted_intervals(page) == ["+1.0% [-2.0%, +3.0%]"]
