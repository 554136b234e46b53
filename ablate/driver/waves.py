"""Sequential seeds (a study's ``seeds: {initial, step, max}``): the study trained in waves, each
configuration given more seeds only while its comparison with the baseline is open.

Wave 1 trains seeds ``0 .. initial - 1`` of every configuration and the baseline. After each wave
every comparison is judged (``ablate.report.waves.judge_study``: ``ablate.report.sequential.judge``
on the paired log tokens to the study's target, stalled pairs left out, censored runs as bounds);
each open one gets ``step`` more seeds, up to ``max``, and the baseline as many as its
most-seeded configuration. The waves are a pure function of what the store holds: a study
interrupted, requeued or run again replays them (``report.waves.replay``), reusing every cell
already trained by its key, and goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import IO, Any

from ablate.errors import AblateError
from ablate.report.waves import Comparison, configs_of, grow, judge_study, replay, wave_cells
from ablate.study import Study


def run_waves(
    study: Study,
    run_cells: Callable[[Study], Any],
    out: IO[str],
    *,
    fast_forward: bool = True,
    drain: Callable[[], str] | None = None,
) -> tuple[Any, dict[str, Comparison]]:
    """Train ``study`` in waves; ``run_cells`` runs a study of the wave's cells and fixed seeds
    (``run_study``) and returns its result. Returns the last wave's result and comparisons; stops early
    when a wave is interrupted or leaves a cell failed (the next run replays the waves).
    ``fast_forward``: the waves whose cells have all ended are replayed from the store
    (``report.waves.replay``, the same judgements) instead of passing each through ``run_cells``;
    the run starts at the first wave with a cell to train (or, when every wave has ended, passes
    the last one through, which trains nothing). Off, every wave passes through ``run_cells``
    (``--rerun-stale`` reruns stale cells of any wave). ``drain`` (``run_study``'s) is asked again
    before a next wave starts: a drain that came while the last cells of a wave ended (too late to
    stop any of them) stops the run there, ``interrupted``, and the next run replays the waves."""
    plan = study.sequential
    assert plan is not None
    seeds = {c: plan.initial for c in configs_of(study)}
    wave = 0
    judged: dict[str, Comparison] = {}
    if fast_forward:
        try:
            rp = replay(study)
        except AblateError:  # nothing recorded yet
            rp = None
        if rp is not None and rp.waves:
            seeds, judged = rp.seeds, rp.judged
            wave = rp.waves - 1 if rp.done else rp.waves  # done: the last wave once more
            if wave:
                print(f"waves 1-{wave}: replayed from the store (every cell ended)", file=out)
    while True:
        wave += 1
        part = dataclasses.replace(study, cells=wave_cells(study, seeds))
        print(
            f"wave {wave}: seeds per configuration: "
            + ", ".join(f"{c} {n}" for c, n in seeds.items()),
            file=out,
        )
        # the wave as a study of fixed seeds: its cells, trained (or skipped) as any study's
        result = run_cells(
            dataclasses.replace(part, file=part.file.model_copy(update={"seeds": None}))
        )
        if getattr(result, "interrupted", False) or getattr(result, "failed", []):
            return result, judged
        judged = judge_study(part, seeds)
        for comp in judged.values():
            print(f"  {comp.line()}", file=out)
        nxt = grow(plan, seeds, judged)
        if nxt == seeds:
            still = [c for c, j in judged.items() if j.judgement.state == "open"]
            if still:
                print(f"{len(still)} configuration(s) open at seeds.max ({plan.max})", file=out)
            else:
                print(f"every configuration decided after {wave} wave(s)", file=out)
            return result, judged
        if drain is not None and (why := drain()):
            print(f"stopping: {why}: wave {wave + 1} starts when the study runs again", file=out)
            return dataclasses.replace(result, interrupted=True), judged
        seeds = nxt
