"""What produced the report's numbers: each run's ``env.*`` provenance (``ablate.train.provenance``,
read from MLflow by ``ablate.report.study``) gathered per configuration and for the whole study,
and the tokens each run trained on (its ``data.fingerprint``): runs of two numerics versions
(``check_numerics``), or cells of one data configuration that trained on other tokens
(``check_data``), are not compared unless told to.

The provenance columns are optional in the report's ``cells`` input (``PROVENANCE``): a report built
from frames without them (synthetic studies, runs recorded before provenance existed) says that the
provenance is unknown rather than failing; so are ``data_config`` and ``data_fingerprint`` (without
them the data are not checked). pandas only.
"""

from __future__ import annotations

from typing import Any

PROVENANCE = (
    "numerics",
    "code_hash",
    "git_commit",
    "git_dirty",
    "device_name",
    "precision",
    "torch",
    "ablate_version",
)
"""The ``env.*`` fields a report carries per run (the names of ``ablate.train.provenance``)."""
PER_CONFIG = ("numerics", "code_hash", "git_commit", "device_name", "precision", "torch")
"""The fields summary.csv carries per configuration (distinct values over its runs, "; "-joined)."""
UNKNOWN = "unknown"


FIRST_VERSION = "1"
"""The numerics of a run that recorded none: every run before the version existed."""


def _columns(cells: Any) -> Any:
    """``cells`` restricted to runs that exist, with every provenance column present (unknown
    where missing or empty; a run's empty ``numerics`` is version 1, which recorded none)."""
    ran = cells[cells["status"] != "pending"].copy()
    for col in PROVENANCE:
        if col not in ran.columns:
            ran[col] = UNKNOWN
        empty = FIRST_VERSION if col == "numerics" else UNKNOWN
        ran[col] = ran[col].fillna("").astype(str).replace("", empty)
    return ran


def numerics_versions(cells: Any) -> dict[str, list[str]]:
    """The numerics versions of the runs that recorded provenance: version -> its configurations."""
    ran = _columns(cells)
    ran = ran[ran["numerics"] != UNKNOWN]
    return {
        str(v): list(dict.fromkeys(sub["config"])) for v, sub in ran.groupby("numerics", sort=True)
    }


def check_numerics(cells: Any, *, mixed: bool = False) -> str | None:
    """Raise ``ReportError`` when the runs come from more than one numerics version (cells
    adopted from an older store beside new ones), naming each version's configurations; with
    ``mixed`` return the note the report then carries instead. None when there is one."""
    from ablate.errors import ReportError

    versions = numerics_versions(cells)
    if len(versions) < 2:
        return None
    which = "; ".join(
        f"numerics {v}: {', '.join(f'`{c}`' for c in cfgs[:6])}{' ...' if len(cfgs) > 6 else ''}"
        for v, cfgs in versions.items()
    )
    if not mixed:
        raise ReportError(
            f"the runs come from {len(versions)} numerics versions ({which}): comparing them "
            "mixes two sets of numbers. Rerun the older cells (`ablate run --rerun-stale`), or "
            "report them anyway with --mix-numerics (the report then says so)"
        )
    return (
        f"The runs come from {len(versions)} numerics versions ({which}), compared anyway "
        "(--mix-numerics): differences between them may be the numerics', not the recipes'."
    )


ENDED = ("finished", "diverged")
"""The cells the report compares (``ablate.tracking.vocab.ENDED``): those with a result."""


def data_tokens(cells: Any) -> dict[str, dict[str, dict[str, list[str]]]]:
    """The tokens the ended cells trained on: data configuration (``data_config``; "" when the
    column is absent) -> ``data.fingerprint`` -> configuration -> its seeds, of the runs that
    recorded one (empty without a ``data_fingerprint`` column)."""
    if "data_fingerprint" not in cells.columns:
        return {}
    ended = cells[cells["status"].isin(ENDED)]
    fps = ended["data_fingerprint"].fillna("").astype(str)
    datas = ended["data_config"].fillna("").astype(str) if "data_config" in ended else fps.str[:0]
    out: dict[str, dict[str, dict[str, list[str]]]] = {}
    for data, fp, cfg, seed in zip(datas, fps, ended["config"], ended["seed"], strict=True):
        if fp:
            out.setdefault(data, {}).setdefault(fp, {}).setdefault(str(cfg), []).append(str(seed))
    return out


def _trained_on(data: str, fps: dict[str, dict[str, list[str]]]) -> str:
    """``data.corpus text, ...: data.fingerprint X (`cfg` seeds 0, 1, ...) and data.fingerprint
    Y (...)``."""
    parts = []
    for fp, configs in fps.items():
        named = [
            f"`{c}` seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"
            for c, seeds in configs.items()
        ]
        more = f" and {len(named) - 6} more configurations" if len(named) > 6 else ""
        parts.append(f"data.fingerprint {fp} ({', '.join(named[:6])}{more})")
    return f"{data or 'the data'}: {' and '.join(parts)}"


def check_data(cells: Any, *, mixed: bool = False) -> str | None:
    """Raise ``ReportError`` when ended cells of one data configuration (the same data fields:
    meant to read the same tokens) recorded other ``data.fingerprint``s (a corpus changed between
    their runs), naming the configuration, each fingerprint and the cells that trained on it; with
    ``mixed`` return the note the report then carries instead. None when they agree. Cells of
    different data configurations (a study that varies its data) are not compared so, and a run
    that recorded no fingerprint is left out of it (``data_notes`` says so)."""
    from ablate.errors import ReportError

    mixes = [(d, fps) for d, fps in data_tokens(cells).items() if len(fps) > 1]
    if not mixes:
        return None
    which = "; ".join(_trained_on(d, fps) for d, fps in mixes)
    if not mixed:
        raise ReportError(
            f"cells of one data configuration trained on other tokens ({which}): a corpus "
            "changed between their runs, and comparing them measures the change of data, not "
            "the recipes'. Rerun the cells trained on the older data (`ablate run --rerun-stale` "
            "trains anew each finished or diverged cell whose data prepare to other tokens now), "
            "or report them anyway with --mix-data (the report then says so)"
        )
    return (
        f"Cells of one data configuration trained on other tokens ({which}), compared anyway "
        "(--mix-data): differences between them may be the data's, not the recipes'."
    )


def data_notes(cells: Any) -> list[str]:
    """A note when ended runs recorded no ``data.fingerprint`` (a frame without the column: none):
    which tokens they trained on is not known, so ``check_data`` cannot compare them."""
    if "data_fingerprint" not in cells.columns:
        return []
    ended = cells[cells["status"].isin(ENDED)]
    unknown = ended[ended["data_fingerprint"].fillna("").astype(str) == ""]
    if unknown.empty:
        return []
    labels = ", ".join(f"`{x}`" for x in unknown["label"][:6]) + (
        " ..." if len(unknown) > 6 else ""
    )
    return [
        f"{len(unknown)} of {len(ended)} ended runs recorded no data fingerprint "
        f"(`data.fingerprint`: {labels}): which tokens they trained on is not known, and they are "
        "not checked against the other runs of their data."
    ]


def _distinct(values: Any) -> str:
    return "; ".join(sorted(set(values)))


def per_config(cells: Any) -> Any:
    """One row per configuration: ``config`` and the distinct values of each ``PER_CONFIG`` field
    over its runs ("; "-joined; ``unknown`` for runs that recorded none)."""
    import pandas as pd

    ran = _columns(cells)
    rows = [
        {"config": cfg, **{col: _distinct(sub[col]) for col in PER_CONFIG}}
        for cfg, sub in ran.groupby("config", sort=False)
    ]
    return pd.DataFrame(rows, columns=["config", *PER_CONFIG])


def table(cells: Any) -> tuple[list[str], list[list[str]]]:
    """The report's Provenance table: one row per distinct (numerics, code, commit, device,
    precision, torch, ablate) combination, with how many runs and which configurations it
    produced."""
    ran = _columns(cells)
    headers = [
        "runs",
        "numerics",
        "code hash",
        "git commit",
        "device",
        "precision",
        "torch",
        "ablate",
        "configs",
    ]
    rows = []
    keys = ["numerics", "code_hash", "git_commit", "git_dirty", "device_name", "precision", "torch"]
    for values, sub in ran.groupby([*keys, "ablate_version"], sort=True):
        numerics, code, commit, dirty, device, precision, torch, version = values
        commit_text = commit[:12] + (" (dirty)" if dirty == "true" else "")
        configs = ", ".join(f"`{c}`" for c in dict.fromkeys(sub["config"]))
        rows.append(
            [str(len(sub)), numerics, code, commit_text, device, precision, torch, version, configs]
        )
    return headers, rows


def notes(cells: Any) -> list[str]:
    """Warnings for the top of the report: results produced by different training code, on
    different devices or precisions, or by runs that recorded no provenance or no data
    fingerprint (``data_notes``)."""
    ran = _columns(cells)
    out = []
    known = ran[ran["code_hash"] != UNKNOWN]
    codes = sorted(set(known["code_hash"]))
    if len(codes) > 1:
        out.append(
            f"The runs were produced by {len(codes)} versions of the training code (code hashes "
            f"{', '.join(codes)}; see Provenance): `ablate plan` marks the older ones stale and "
            "`ablate run --rerun-stale` reruns them."
        )
    for field, what in (("device_name", "devices"), ("precision", "precisions")):
        values = sorted(set(known[field]))
        if len(values) > 1:
            out.append(f"The runs ran on {len(values)} {what}: {', '.join(values)}.")
    if line := reused_note(ran):
        out.append(line)
    missing = len(ran) - len(known)
    if missing:
        out.append(
            f"{missing} of {len(ran)} runs recorded no provenance (recorded before `env.*` tags "
            "existed): which code produced them is unknown."
        )
    return [*out, *data_notes(cells)]


def reused_note(cells: Any) -> str | None:
    """Where the baseline seeds copied from another store (``baseline_from``) were trained, and
    which baseline seeds trained here (None: every run trained here, or the column is absent)."""
    if "reused_from" not in cells.columns:
        return None
    base = cells[cells["baseline"]]
    where = base["reused_from"].fillna("").astype(str)
    if not (where != "").any():
        return None
    runs = base["reused_run"] if "reused_run" in base.columns else where.str[:0]  # none: ""
    runs = runs.fillna("").astype(str)
    groups: dict[str, list[tuple[str, str]]] = {}  # source -> (seed, its run there)
    for seed, w, run in zip(base["seed"], where, runs, strict=True):
        if w:
            groups.setdefault(w, []).append((str(seed), run[:12]))
    parts = [
        f"seed(s) {', '.join(s for s, _ in g)} from {source} (runs {', '.join(r for _, r in g)})"
        for source, g in groups.items()
    ]
    here = [str(seed) for seed, w in zip(base["seed"], where, strict=True) if w == ""]
    trained = f"; trained here: seed(s) {', '.join(here)}" if here else ""
    return (
        "Baseline seeds reused, not trained here (`baseline_from`: the same keys, so the same "
        f"runs): {'; '.join(parts)}{trained}."
    )
