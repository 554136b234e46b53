"""A study's data, prepared before any of its cells starts: ``prepare_study`` tokenizes each
distinct data configuration once into the study's data cache (``ablate.data.prepared``), checks
the checksums of sets prepared before, and checks every cell's token counts. ``ablate run``,
``ablate tune`` and ``ablate data prepare`` call it; a refusal comes before anything is recorded.
``check_hub_data`` refuses at once a hub dataset that neither a cache nor the hub can give
(``validate`` asks too, through ``preflight.check_hub``). ``data_changes`` says how each cell's
data changed since its run trained on them (other tokens, or files changed and not prepared yet),
naming the field that changed, for ``planning``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ablate.data import (
    DataConfig,
    Prepared,
    ValData,
    already_prepared,
    check_counts,
    data_key,
    prepare,
)
from ablate.data.config import BATCH_FIELDS
from ablate.data.manifest import changed_parts
from ablate.data.prepared import identity_changes, prepared_set
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
    the sets already in the cache (sizes checked, not checksums). Each key is computed once for the
    cells whose data differ only in what splits and orders their tokens (``BATCH_FIELDS``: each seed
    has its own ``data_seed``): a key stats every corpus file and hashes a tokenizer file."""
    sets: dict[str, DataSet] = {}
    keys: dict[str, str] = {}
    for c in study.cells if cells is None else cells:
        same = json.dumps(
            {k: v for k, v in dataclasses.asdict(c.config.data).items() if k not in BATCH_FIELDS},
            sort_keys=True,
            default=str,
        )
        if same not in keys:
            keys[same] = data_key(c.config.data)
        key = keys[same]
        sets.setdefault(key, DataSet(key, c.config.data)).cells.append(c)
    for s in sets.values():
        s.prepared = already_prepared(s.config, study.data_cache())
    return list(sets.values())


def data_now(sets: Iterable[DataSet]) -> dict[str, DataSet]:
    """The data each cell reads now, by cell key: the key its files give and, where prepared, its
    set (``data_changes`` compares them with what its run recorded)."""
    return {c.key: s for s in sets for c in s.cells}


@dataclass(frozen=True)
class DataChange:
    """How a cell's data now differ from those its run trained on (``data_changes``)."""

    fields: tuple[str, ...]
    """The fields whose data changed, each with its value (``data.path corp/a.txt``); where that
    is not known (the set it trained on is gone from the cache), every field of its data."""
    known: bool
    """Whether ``fields`` are those that changed (else: one of them did)."""
    detail: str
    """What shows it: both fingerprints, or both keys and the files that changed."""
    tokens: bool
    """Known to prepare to other tokens (both sets' fingerprints); False: its files changed since
    and are not prepared yet, so their tokens are not known (files only touched give the same)."""

    def said(self) -> str:
        """The change in the words ``run`` refuses a cell with, and ``plan`` shows."""
        if self.tokens:
            verb = "prepare" if self.known and len(self.fields) > 1 else "prepares"
            return f"trained on other data than {self.named()} {verb} to now ({self.detail})"
        return (
            f"its data changed since it trained ({self.named()}: {self.detail}); whether their "
            "tokens did is known once they are prepared"
        )

    def named(self) -> str:
        return (" and " if self.known else " or ").join(self.fields)


def source_field(src: DataConfig | ValData, part: str = "data.") -> str:
    """The field that names a corpus's data, with its value: ``data.path``, ``data.hf_dataset``
    or ``data.corpus`` (``part`` ``data.val.``: the validation corpus's)."""
    if src.path:
        return f"{part}path {src.path}"
    if src.hf_dataset:
        return f"{part}hf_dataset {src.hf_dataset}"
    return f"{part}corpus {src.corpus}"


def _fields(cfg: DataConfig, parts: Iterable[str]) -> tuple[tuple[str, ...], bool]:
    """The fields of ``parts`` (``data.``, ``data.val.``, ``data.tokenizer``) with their values, and
    whether they are known: none given, every corpus field of ``cfg``."""
    named = {
        "data.": source_field(cfg),
        "data.tokenizer": f"data.tokenizer {cfg.tokenizer}",
        **({"data.val.": source_field(cfg.val, "data.val.")} if cfg.val is not None else {}),
    }
    fields = tuple(dict.fromkeys(named[p] for p in parts if p in named))
    if fields:
        return fields, True
    return tuple(v for k, v in named.items() if k != "data.tokenizer"), False


def data_changes(
    recorded: Mapping[str, Mapping[str, str]], now: Mapping[str, DataSet], cache: Path
) -> dict[str, DataChange]:
    """By cell key, how the data of each cell changed since its run recorded them (``recorded``:
    each run's ``data.fingerprint`` and ``data.prepared``, by cell key; ``now``: ``data_now``);
    a cell whose data did not change, or whose run recorded none yet, is left out. Read only, and
    nothing is tokenized: a set not prepared yet is compared by its key, its files' sizes and
    modification times (then ``DataChange.tokens`` is False). The field that changed is named from
    the set the run trained on, where it is still in ``cache``."""
    out: dict[str, DataChange] = {}
    memo: dict[tuple[str, str, str], DataChange | None] = {}
    for cell_key, params in recorded.items():
        fp, key = params.get("data.fingerprint", ""), params.get("data.prepared", "")
        s = now.get(cell_key)
        if not fp or s is None:
            continue
        if (fp, key, s.key) not in memo:
            memo[fp, key, s.key] = _change(fp, key, s, cache)
        if (change := memo[fp, key, s.key]) is not None:
            out[cell_key] = change
    return out


def _change(fp: str, key: str, s: DataSet, cache: Path) -> DataChange | None:
    if s.prepared is not None:  # its tokens are known
        if fp == s.prepared.fingerprint:
            return None
        old = prepared_set(key, cache) if key else None
        parts = changed_parts(old.manifest, s.prepared.manifest) if old is not None else []
        detail = f"data.fingerprint {fp}, now {s.prepared.fingerprint}"
        return DataChange(*_fields(s.config, parts), detail, tokens=True)
    if not key or key == s.key:  # the same files as it trained on (or not known)
        return None
    old = prepared_set(key, cache)
    try:
        changes = identity_changes(s.config, old.manifest["identity"]) if old else []
    except (OSError, ValueError, KeyError, TypeError):  # a file gone since, an odd manifest
        changes = []
    what = ", ".join(w for _, w in changes[:3]) + (
        f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    )
    detail = f"{what + '; ' if what else ''}data.prepared {key}, now {s.key}"
    return DataChange(*_fields(s.config, [p for p, _ in changes]), detail, tokens=False)


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
