"""The data benchmark (ablate.bench.data) runs end to end on small corpora and reports each
figure it promises; the figures themselves are in docs/data.md, never asserted as times here."""

from __future__ import annotations

import json

import pytest

from ablate.bench.data import main

pytest.importorskip("tokenizers")


def test_the_data_benchmark_reports_preparation_start_up_and_the_loaders_share(capsys) -> None:
    main(
        [
            "--prep-mb",
            "0.3",
            "--sizes",
            "200KB",
            "600KB",
            "--repeats",
            "1",
            "--steps",
            "5",
            "--bpe-vocab",
            "300",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    prep = out["preparation"]
    assert [(r["tokenizer"], r["processes"]) for r in prep] == [
        ("bpe300", 1),
        ("bpe300", 2),
        ("byte", 1),
    ]
    assert prep[0]["tokens"] == prep[1]["tokens"] > 0 and prep[1]["speedup_over_1"] > 0
    assert prep[2]["tokens"] > prep[0]["tokens"]  # bytes: more tokens than BPE's merges
    small, large = out["start_up"]
    assert large["tokens"] > 2.5 * small["tokens"]
    assert all(r["start_up_ms"] > 0 and r["rss_growth_mib"] < 64 for r in out["start_up"])
    assert 0 < out["loader"]["share"] < 1
