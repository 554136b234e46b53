"""build_report end to end on small synthetic studies: every file, self-contained HTML, plain messages."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from ablate.errors import ReportError
from ablate.report.markup import markdown_table, tokens
from ablate.report.plots import styles
from ablate.report.render import build_report
from ablate.report.synthetic import synthetic_study
from ablate.study.speedup import SpeedupSection

FILES = [
    "report.md",
    "report.html",
    "summary.csv",
    *(
        f"{name}.{ext}"
        for name in ("convergence", "convergence_late", "token_cost", "speedup", "equal_loss")
        for ext in ("png", "svg")
    ),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    # 4 configs x 3 seeds x 40 evaluations; config 3 seed 2 diverges at 50%; config 2 loses seed 1
    cells, evals, target = synthetic_study(4, 3, 40, diverge={(3, 2): 0.5})
    cells, evals = cells[cells["key"] != "c02s1"], evals[evals["key"] != "c02s1"]
    out = tmp_path_factory.mktemp("report")
    result = build_report(
        cells,
        evals,
        {"val_ppl": target},
        SpeedupSection(),
        out,
        study="demo",
        notes=["2 runs still pending."],
    )
    return result, cells


def test_build_report_writes_every_file(report):
    result, _ = report
    for name in FILES:
        path = result.out_dir / name
        assert path.is_file() and path.stat().st_size > 0, name
    assert set(result.figures) == {
        "convergence",
        "convergence_late",
        "token_cost",
        "speedup",
        "equal_loss",
    }


def test_summary_csv_has_one_row_per_config(report):
    result, cells = report
    summary = pd.read_csv(result.summary_csv)
    assert len(summary) == cells["config"].nunique() == 4
    assert summary["baseline"].tolist() == [True, False, False, False]
    for col in (
        "seeds_reached",
        "seeds_total",
        "rel_token_cost",
        "rel_token_cost_lo",
        "rel_token_cost_hi",
        "rel_token_cost_kind",
        "equal_loss_token_ratio",
        "equal_loss_token_ratio_lo",
        "equal_loss_token_ratio_hi",
        "projected_speedup",
        "projected_speedup_lo",
        "projected_speedup_hi",
        "speedup_source",
        "target_ppl",
    ):
        assert col in summary.columns
    assert set(summary["rel_token_cost_kind"]) <= {"reference", "observed", "censored", "bound"}


def test_html_is_self_contained(report):
    html = report[0].report_html.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<link" not in html and "<script" not in html
    assert html.count("data:image/png;base64,") == 5


def test_markdown_states_target_notes_missing_seed_divergence_and_the_speedup_model(report):
    result, _ = report
    md = result.report_md.read_text()
    assert f"**{result.target_ppl:.4g}**" in md
    assert "2 runs still pending." in md  # the caller's note
    assert "fewer than 3 seeds" in md  # config 2 has 2
    assert "diverged: seed 2 at step" in md
    assert "model:mi355x" in md and "gemm" in md.lower()
    for png in ("convergence.png", "convergence_late.png", "token_cost.png", "speedup.png"):
        assert f"]({png})" in md


def test_baseline_that_never_reaches_the_target_is_reported_not_raised(tmp_path):
    cells, evals, target = synthetic_study(3, 2, 30)
    # target far below anything reached: the baseline (and everything else) never gets there
    result = build_report(cells, evals, {"val_ppl": 1.5}, None, tmp_path, study="unreachable")
    table = result.config_table
    assert table["rel_token_cost"].isna().all() and table["seeds_reached"].eq(0).all()
    md = result.report_md.read_text()
    assert "never reached the target perplexity 1.5" in md
    assert "relative token costs and projected speedups are undefined" in md
    assert pd.read_csv(result.summary_csv)["rel_token_cost"].isna().all()


def test_the_report_opens_with_a_verdict_that_sorts_configurations_by_their_interval(report):
    result, _ = report
    md = result.report_md.read_text()
    assert md.index("## Verdict") < md.index("## Summary") < md.index("## Figures")
    html = result.report_html.read_text()
    assert html.index("Verdict") < html.index("Summary")
    verdict = md[md.index("## Verdict") : md.index("## Summary")]
    table = result.config_table
    for r in table[~table["baseline"]].to_dict("records"):
        assert f"`{r['config']}`" in verdict
    # the synthetic config 3 lost a seed to divergence: never called better
    c3 = table.iloc[3]
    assert c3["n_diverged"] == 1
    undetermined = verdict[verdict.index("**Undetermined**") :]
    assert f"`{c3['config']}`" in undetermined.split("\n")[0]


def test_a_target_met_before_training_is_refused_naming_it(tmp_path):
    """Every run evaluates at step 0; a target at or above that perplexity is met at 0 tokens,
    where a token cost means nothing (it ended in a ValueError of the censored fit)."""
    cells, evals, _ = synthetic_study(3, 2, 30)
    start = pd.DataFrame(
        {"key": cells["key"], "step": 0, "tokens": 0.0, "val_loss": math.log(50.0)}
    )
    evals = pd.concat([start, evals], ignore_index=True)
    with pytest.raises(ReportError, match=r"target: val ppl 1000 is reached before any training"):
        build_report(cells, evals, {"val_ppl": 1000}, None, tmp_path / "r", study="easy")
    assert not (tmp_path / "r" / "report.md").exists()
    result = build_report(cells, evals, {"val_ppl": 20}, None, tmp_path / "ok", study="fine")
    assert result.config_table["seeds_reached"].gt(0).all()


def test_fp4_gemm_sets_get_distinct_colours_and_interventions_distinct_line_styles():
    cells, _, _ = synthetic_study(10, 1, 2)
    table = cells.drop_duplicates("config").assign(baseline=lambda d: d["baseline"].astype(bool))
    st = styles(table)
    by_gemms = {
        g: st[c]["color"]
        for g, c, i in zip(table["fp4_gemms"], table["config"], table["intervention"], strict=True)
        if i == "none"
    }
    assert len(set(by_gemms.values())) == 4 and by_gemms[""] == (0.0, 0.0, 0.0)  # baseline black
    full = table[table["fp4_gemms"] == "fprop+dgrad+wgrad"]
    kinds = {
        i.rstrip("0123456789"): str(st[c]["linestyle"])
        for i, c in zip(full["intervention"], full["config"], strict=True)
    }
    assert len(set(kinds.values())) == len(kinds)  # none, sr, rht, dht, fht, sr+rht all differ
    # and each intervention on the full set has a colour of its own (not shades of one red)
    colours = [st[c]["color"] for c in full["config"]]
    assert len(set(colours)) == len(colours) >= 4
    looks = {(st[c]["color"], str(st[c]["linestyle"]), st[c]["marker"]) for c in table["config"]}
    assert len(looks) == len(table)


def test_html_turns_every_inline_markdown_span_into_markup_and_escapes_the_rest():
    from ablate.report.markup import _inline

    assert _inline("*not reached*, *partial*") == "<em>not reached</em>, <em>partial</em>"
    assert _inline("**fp8** (baseline)") == "<strong>fp8</strong> (baseline)"
    assert _inline("`a*b*c` and `x<y`") == "<code>a*b*c</code> and <code>x&lt;y</code>"
    assert _inline("2 * 3 * 4 < 5 & 6") == "2 * 3 * 4 &lt; 5 &amp; 6"  # no emphasis, escaped
    assert _inline("([SVG](token_cost.svg))") == '(<a href="token_cost.svg">SVG</a>)'


def test_html_has_no_literal_markdown_left_and_its_tables_scroll_in_a_box(report):
    html = report[0].report_html.read_text()
    body = html[html.index("<body>") :]
    text = re.sub(r"<[^>]+>", "", body)
    assert not re.search(r"\*\S[^*]*\S\*|`", text), "literal Markdown left in the HTML"
    assert "<em>" in body
    assert body.count('<div class="table-wrap">') == body.count("<table>") > 0


def test_summary_table_is_sorted_by_projected_speedup_after_the_baseline(report):
    result, _ = report
    md = result.report_md.read_text()
    summary = md[md.index("## Summary") : md.index("## Figures")]
    rows = [line for line in summary.splitlines() if line.startswith("| ")][2:]
    assert "(baseline)" in rows[0]
    by_name = result.config_table.set_index("config")["projected_speedup"]
    order = [r.split(" | ")[0].lstrip("| ") for r in rows[1:]]
    speedups = [by_name[c] for c in order]
    finite = [x for x in speedups if math.isfinite(x)]
    assert finite == sorted(finite, reverse=True) and len(finite) >= 2
    assert speedups[: len(finite)] == finite  # the ones without a point come last


def test_markdown_table_and_token_formatting():
    assert tokens(1.55e9) == "1.55B" and tokens(4.2e7) == "42.0M" and tokens(math.nan) == "–"
    md = markdown_table(["config", "cost"], [["a|b", "+8.5%"]])
    assert md.splitlines() == ["| config | cost |", "| --- | ---: |", "| a\\|b | +8.5% |"]


def test_tuning_section_lists_best_value_and_parameters_per_search(tmp_path):
    cells, evals, target = synthetic_study(2, 2, 10)
    tuning = [
        {
            "search": "bf16",
            "objective": "final_val_loss",
            "complete": 5,
            "pruned": 1,
            "failed": 0,
            "best_value": 1.234567,
            "best_params": {"train.lr": 0.00312, "train.warmup_steps": 8},
            "importance": {"train.lr": 0.8, "train.warmup_steps": 0.2},
        },
        {"search": "mxfp4", "complete": 0, "pruned": 0, "failed": 2, "best_value": None},
    ]
    res = build_report(
        cells, evals, {"val_ppl": target}, None, tmp_path, study="s", tuning=tuning, figures=()
    )
    md = res.report_md.read_text()
    assert "## Tuning" in md and md.index("## Tuning") < md.index("## Runs")
    assert "train.lr=0.00312, train.warmup_steps=8" in md
    assert "train.lr 80%" in md and "5 / 1 / 0" in md and "1.235" in md
    assert "Tuning" in res.report_html.read_text()


def test_provenance_is_reported_per_configuration_and_mixed_code_is_called_out(tmp_path):
    cells, evals, target = synthetic_study(2, 2, 20)
    # synthetic frames carry no provenance: the report says so instead of failing
    bare = build_report(
        cells, evals, {"val_ppl": target}, SpeedupSection(), tmp_path / "a", study="d", figures=()
    )
    assert any("4 of 4 runs recorded no provenance" in n for n in bare.notes)
    assert set(pd.read_csv(bare.summary_csv)["code_hash"]) == {"unknown"}
    # one run produced by other training code, on the same device and precision
    cells = cells.assign(
        numerics="2",
        code_hash=["aaaa", "aaaa", "aaaa", "bbbb"],
        git_commit="0123456789abcdef",
        git_dirty=["false", "false", "false", "true"],
        device_name="cpu: test",
        precision="fp32",
        torch="2.13.0",
        ablate_version="0.1.0",
    )
    result = build_report(
        cells, evals, {"val_ppl": target}, SpeedupSection(), tmp_path / "b", study="d", figures=()
    )
    (mixed,) = [n for n in result.notes if "versions of the training code" in n]
    assert "2 versions" in mixed and "aaaa, bbbb" in mixed and "--rerun-stale" in mixed
    assert not any(
        "devices" in n or "precisions" in n or "no provenance" in n for n in result.notes
    )
    summary = pd.read_csv(result.summary_csv).set_index("config")
    last = cells["config"].iloc[-1]
    assert summary.loc[last, "code_hash"] == "aaaa; bbbb"
    assert summary.loc[cells["config"].iloc[0], "code_hash"] == "aaaa"
    md = result.report_md.read_text()
    section = md.split("## Provenance")[1].split("## Method")[0]
    assert "| 3 | 2 | aaaa | 0123456789ab |" in section
    assert "| 1 | 2 | bbbb | 0123456789ab (dirty) |" in section


def test_runs_of_two_numerics_versions_are_compared_only_when_told(tmp_path):
    cells, evals, target = synthetic_study(2, 2, 20)
    # one configuration's runs adopted from a store of numerics 1, the other's trained now
    first = cells["config"].iloc[0]
    cells = cells.assign(numerics=["1" if c == first else "2" for c in cells["config"]])
    with pytest.raises(
        ReportError, match=r"2 numerics versions \(numerics 1: `.+`; numerics 2"
    ) as e:
        build_report(cells, evals, {"val_ppl": target}, SpeedupSection(), tmp_path / "a", study="d")
    assert "--mix-numerics" in str(e.value) and "--rerun-stale" in str(e.value)
    assert not (tmp_path / "a" / "report.md").exists()
    res = build_report(
        cells, evals, {"val_ppl": target}, SpeedupSection(), tmp_path / "b", study="d",
        mix_numerics=True, figures=(),
    )  # fmt: skip
    (note,) = [n for n in res.notes if "numerics versions" in n]
    assert "--mix-numerics" in note and "may be the numerics'" in note
    assert "numerics versions" in res.report_md.read_text()
    # a run that recorded no version is version 1: beside version 2 it is refused likewise
    cells = cells.assign(numerics=["" if c == first else "2" for c in cells["config"]])
    with pytest.raises(ReportError, match="numerics 1"):
        build_report(cells, evals, {"val_ppl": target}, SpeedupSection(), tmp_path / "c", study="d")


def test_cells_of_one_data_configuration_on_other_tokens_are_compared_only_when_told(tmp_path):
    cells, evals, target = synthetic_study(2, 2, 20)
    base, other = cells["config"].unique()
    # seed 1 of each configuration trained after the corpus changed (data.fingerprint bbbb)
    data = "data.corpus text, data.path corp/a.txt"
    fps = ["aaaa" if s == 0 else "bbbb" for s in cells["seed"]]
    cells = cells.assign(data_config=data, data_fingerprint=fps)
    args = (evals, {"val_ppl": target}, SpeedupSection())
    with pytest.raises(ReportError, match="cells of one data configuration trained on other") as e:
        build_report(cells, *args, tmp_path / "a", study="d")
    said = str(e.value)
    assert f"({data}: data.fingerprint aaaa (`{base}` seed 0, `{other}` seed 0) and " in said
    assert f"data.fingerprint bbbb (`{base}` seed 1, `{other}` seed 1))" in said
    assert "--mix-data" in said and "--rerun-stale" in said
    assert not (tmp_path / "a" / "report.md").exists()
    res = build_report(cells, *args, tmp_path / "b", study="d", mix_data=True, figures=())
    (note,) = [n for n in res.notes if "compared anyway (--mix-data)" in n]
    assert "data.fingerprint bbbb" in note and "may be the data's" in note
    for page in (res.report_md, res.report_html):
        assert "compared anyway (--mix-data)" in page.read_text()
    # data that differ on purpose (one corpus per configuration), a run that did not end, a run
    # that recorded no fingerprint: compared as before, the last said so
    b = "data.corpus text, data.path corp/b.txt"
    apart = cells.assign(
        data_config=[data if c == base else b for c in cells["config"]],
        data_fingerprint=["aaaa" if c == base else "bbbb" for c in cells["config"]],
    )
    failed = ["finished", "failed", "finished", "finished"]
    one = cells.assign(data_fingerprint=["aaaa", "bbbb", "aaaa", "aaaa"], status=failed)
    for ok in (apart, one, cells.assign(data_fingerprint=["aaaa", "", "aaaa", "aaaa"])):
        res = build_report(ok, *args, tmp_path / "c", study="d", figures=())
        assert not any("--mix-data" in n for n in res.notes)
    (note,) = [n for n in res.notes if "no data fingerprint" in n]
    assert note.startswith("1 of 4 ended runs recorded no data fingerprint (`data.fingerprint`: `")


def test_figures_drop_titles_on_request_draw_censored_costs_hollow_and_label_tokens(report):
    from ablate.report import bars, plots

    result, _ = report
    table = result.config_table
    assert table["partial"].any()
    fig = bars.plot_token_cost(table, title="t", titles=False)
    (ax,) = fig.axes
    assert ax.get_title() == ""
    hollow = [b for b in ax.patches if b.get_facecolor()[3] == 0 and b.get_width() != 0]
    assert len(hollow) == int((table["partial"] & table["rel_token_cost"].notna()).sum())
    fig = bars.plot_speedup(table, title="t")
    assert fig.axes[0].get_title() == "t: projected speedup"
    assert plots.token_formatter()(20_000, 0) == "20k"
    assert plots.token_formatter()(1_200_000, 0) == "1.2M"


def test_a_lower_bound_past_every_cost_and_a_long_title_fit_the_token_cost_figure(report):
    # a ladder rung (reports/ladder): one configuration bounded at +18.8% where the costs measured
    # lie within a few percent drew its arrow from +18.8% back to the axis' end, pointing left,
    # and its title (the rung's long name) collapsed the layout
    import io
    import warnings

    from ablate.report import bars

    result, _ = report
    table = result.config_table.copy()
    row = table.index[~table["baseline"]][0]
    top = 100 * float(table["rel_token_cost"].abs().max()) + 50.0  # percent, past every cost
    table.loc[row, ["rel_token_cost", "rel_token_cost_kind", "rel_token_cost_lo"]] = [
        math.nan,
        "bound",
        top / 100,
    ]
    title = "dim=128/n_layers=4/n_heads=4/n_kv_heads=2/ffn_dim=384/eval_every=128/steps=769"
    fig = bars.plot_token_cost(table, title=title)
    (ax,) = fig.axes
    assert ax.get_xlim()[1] > top  # the arrow starts inside the axis and points right
    (arrow,) = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert arrow.xy[0] > arrow.xyann[0] == top
    lines = ax.get_title().split("\n")  # the name broken after a "/", then what is drawn
    assert (
        "".join(lines[:-1]) == f"{title}:"
        and lines[-1] == "tokens to target relative to the baseline"
    )
    assert len(lines) == 3 and max(map(len, lines)) <= 72
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # constrained layout's "axes sizes collapsed to zero"
        fig.savefig(io.BytesIO(), format="png")


def test_a_report_with_a_baseline_trained_longer_marks_only_true_bounds(tmp_path):
    # equal budgets at cost ~0 censor many pairs; the baseline 1.5x longer covers them
    cells, evals, target = synthetic_study(3, 2, 40, baseline_extend=0.5, seed=3)
    result = build_report(cells, evals, {"from_baseline": "slowest"}, SpeedupSection(), tmp_path,
                          study="longer")  # fmt: skip
    md = result.report_md.read_text()
    assert "**Baseline trained longer**" in md and "trained 1.50x the budget" in md
    table = result.config_table
    # the target and tokens to target come from the budget: the same as the same runs without
    # the extension (an extended run's curve up to the budget is the ordinary run's)
    budget = cells.set_index("key")["schedule_steps"]
    plain_cells = cells.assign(schedule_steps=math.nan)
    plain_evals = evals[~(evals["step"] > evals["key"].map(budget))]
    plain = build_report(plain_cells, plain_evals, {"from_baseline": "slowest"}, SpeedupSection(),
                         tmp_path / "plain", study="plain", figures=())  # fmt: skip
    assert result.target_ppl == plain.target_ppl
    for col in ("tokens_to_target", "rel_token_cost", "rel_token_cost_lo", "final_ppl_mean"):
        assert table[col].tolist() == pytest.approx(plain.config_table[col].tolist(), nan_ok=True)
    # "≤" only where the ratio is an upper bound; no ratio without an interval
    for r in table[~table["baseline"]].to_dict("records"):
        two_sided = r["equal_loss_token_ratio_kind"] != "bound"
        assert not two_sided or math.isfinite(r["equal_loss_token_ratio_lo"])
    rows = [line for line in md.splitlines() if line.startswith("| mxfp4")]
    assert rows and all("(≤)" not in line for line in rows)
