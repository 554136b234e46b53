"""The training benchmark's same-run FP8 / MXFP4 ratio (``ablate.bench.train``), on made-up rows."""

from __future__ import annotations

from ablate.bench import train as bench


def _row(preset: str, recipe: str, ms: float) -> dict[str, object]:
    return {
        "preset": preset,
        "recipe": recipe,
        "backend": "emulated",
        "tokens_per_s": 2048 / ms * 1e3,
        "step_ms": ms,
        "vs_bf16": None,
    }


def test_fp8_over_mxfp4_per_preset_and_printed():
    rows = [_row("tiny", "fp8", 150.0), _row("tiny", "mxfp4", 120.0), _row("small", "fp8", 9.0)]
    assert bench.fp8_over_mxfp4(rows) == {"tiny": 1.25}  # small lacks mxfp4
    text = "\n".join(bench.report_lines(rows))
    assert "fp8_over_mxfp4 tiny: 1.250" in text and "small:" not in text


def test_keep_going_turns_a_failed_run_into_a_skipped_row_saying_why():
    # seq_len 1024 is longer than tiny's max_seq_len: the run cannot be built
    (row,) = bench.measure(["tiny"], ["bf16"], "cpu", 1, 1, 1024, keep_going=True)
    assert row["step_ms"] is None and row["skipped"].startswith("failed: ValueError: train.seq_len")
    assert bench.report_lines([row])[1].endswith(row["skipped"])
