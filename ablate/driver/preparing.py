"""A study's data, prepared before any of its cells starts: ``prepare_study`` tokenizes each
distinct data configuration once into the study's data cache (``ablate.data.prepared``), checks
the checksums of sets prepared before, and checks every cell's token counts. ``ablate run``,
``ablate tune`` and ``ablate data prepare`` call it; a refusal comes before anything is recorded.
``check_hub_data`` refuses at once a hub dataset that neither a cache nor the hub can give
(``validate`` asks too, through ``preflight.check_hub``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from ablate.data import DataConfig, Prepared, already_prepared, check_counts, data_key, prepare
from ablate.errors import CannotRunError, StudyError
from ablate.study import Cell, Study


@dataclass
class DataSet:
    """One distinct data configuration of a study, the cells that read it and, once prepared or
    found, its prepared set."""

    key: str
    config: DataConfig
    cells: list[Cell] = field(default_factory=list)
    prepared: Prepared | None = None


def study_data(study: Study, cells: Iterable[Cell] | None = None) -> list[DataSet]:
    """The study's distinct data configurations (by prepared-set key), in order of first use, with
    the sets already in the cache (sizes checked, not checksums)."""
    sets: dict[str, DataSet] = {}
    for c in study.cells if cells is None else cells:
        key = data_key(c.config.data)
        sets.setdefault(key, DataSet(key, c.config.data)).cells.append(c)
    for s in sets.values():
        s.prepared = already_prepared(s.config, study.data_cache())
    return list(sets.values())


def fingerprints(sets: Iterable[DataSet]) -> dict[str, str]:
    """The fingerprint of the prepared data each cell reads, by cell key (for the sets prepared:
    ``planning.stale_data`` compares it with the one its run recorded)."""
    return {c.key: s.prepared.fingerprint for s in sets if s.prepared for c in s.cells}


def check_hub_data(study: Study, cells: Iterable[Cell] | None = None) -> None:
    """A hub dataset that ``run`` would read (its data not prepared in the study's data cache yet)
    must be in the ``datasets`` cache, or the hub reachable (``sources.hub_dataset_missing``):
    refused otherwise, naming the field and the cells, before anything is tokenized, instead of
    failing after the hub client's retries (``preflight.check_hub`` and ``prepare_study`` ask)."""
    from ablate.data.sources import hub_dataset_missing, is_hub_dataset

    hub = [
        c
        for c in (study.cells if cells is None else cells)
        if any(s is not None and is_hub_dataset(s) for s in (c.config.data, c.config.data.val))
    ]
    if not hub:
        return
    try:
        sets = study_data(study, hub)
    except (FileNotFoundError, ValueError, ImportError):
        return  # refused with its field by the study's own checks, or by preparing
    problems: dict[str, list[str]] = {}
    for s in sets:
        if s.prepared is not None:  # tokenized already: read from the data cache, not the hub
            continue
        for src, name in ((s.config, "data."), (s.config.val, "data.val.")):
            try:
                why = None if src is None else hub_dataset_missing(src, name)
            except ImportError:
                continue  # no datasets package: preparing says so, naming the field
            if why is not None:
                problems.setdefault(why, []).extend(c.label for c in s.cells)
    if problems:
        raise CannotRunError(
            "\n".join(
                f"{why} (cells {', '.join(labels[:3])}{' ...' if len(labels) > 3 else ''})"
                for why, labels in problems.items()
            )
        )


def prepare_study(
    study: Study,
    *,
    cells: Iterable[Cell] | None = None,
    workers: int | None = None,
    out: IO[str] | None = None,
) -> list[DataSet]:
    """Prepare (or verify) every data configuration of ``cells`` (default: all the study's) and
    check each cell's counts; raises ``StudyError`` listing every problem, naming its field."""
    out = out or sys.stderr
    check_hub_data(study, cells)
    errors: list[str] = []
    sets = study_data(study, cells)
    cache = study.data_cache()
    for s in sets:
        try:
            s.prepared = prepare(
                s.config,
                cache=cache,
                workers=workers,
                verify=True,
                say=lambda m: print(m, file=out, flush=True),
                progress=out,
            )
            if not s.prepared.built:
                files = s.prepared.manifest["files"]
                counts = ", ".join(f"{f['tokens']:,} {n[:-4]}" for n, f in files.items())
                print(
                    f"data: {s.key} prepared already ({s.prepared.manifest['corpus']}, {counts} "
                    f"tokens) in {cache}",
                    file=out,
                    flush=True,
                )
            for c in s.cells:
                check_counts(c.config.data, s.prepared)
        except (FileNotFoundError, ValueError, ImportError) as e:
            cells_of = ", ".join(c.label for c in s.cells[:3]) + (
                " ..." if len(s.cells) > 3 else ""
            )
            errors.append(f"{e} (cells {cells_of})")
    if errors:
        raise StudyError(errors, study.source)
    return sets
