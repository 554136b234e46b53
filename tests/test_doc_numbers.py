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


DECISION = re.compile(
    r"^- (?P<config>\S+) \((?P<seeds>\d+) seeds\): (?P<state>faster|slower|equivalent|open)"
    r"(?: (?P<cost>[+-][\d.]+%) \[(?P<lo>[+-][\d.]+%), (?P<hi>[+-][\d.]+%)\] on (?P<pairs>\d+) "
    r"pair\(s\)|: (?P<usable>\d+) usable pair\(s\))(?: \((?P<notes>.*)\))?$"
)


def quickstart_paragraph(report_md: str) -> str:
    """The README's paragraph on the kept quickstart report, made from that report alone: its
    sequential decision (the verdict's first list), then the baseline's and the configurations'
    final perplexities from the summary table."""
    verdict = report_md[report_md.index("## Verdict") : report_md.index("## Summary")]
    waves = re.search(r"after (\d+) wave\(s\)", verdict)
    assert waves, "the kept quickstart report has no sequential decision"
    said = []
    for m in (DECISION.match(ln) for ln in verdict.splitlines()):
        if not m:
            continue
        if m["usable"]:
            how = f"*open* at {m['seeds']} seeds ({m['usable']} usable pairs)"
        elif m["state"] == "open":
            how = f"still *open* at {m['seeds']} seeds, {m['cost']} [{m['lo']}, {m['hi']}] tokens"
        else:
            how = f"*{m['state']}*, {m['cost']} [{m['lo']}, {m['hi']}] tokens on {m['pairs']} pairs"
        more = re.search(r"about (\d+) pairs would decide it", m["notes"] or "")
        if more:
            how += f", about {more[1]} pairs would decide it"
        said.append(f"`{m['config']}` {how}")
    rows = _summary_rows(report_md)
    base = next(r for r in rows if "(baseline)" in r["configuration"])
    ppl = [float(r["final ppl"].split(" ± ")[0]) for r in rows if r is not base]
    n = waves[1]
    return (
        f"The kept report trained {n} wave{'s' if n != '1' else ''} of seeds and decides the "
        f"token cost against the FP8 baseline: {'; '.join(said)}. The baseline's "
        f"{base['seeds reached'].split('/')[1]} seeds end at mean perplexity {base['final ppl']}; "
        f"the configurations' means lie between {min(ppl):g} and {max(ppl):g}."
    )


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
    kept = " ".join(p.read_text() for p in (ROOT / "reports").rglob("report.md"))
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
