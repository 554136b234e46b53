"""Where a study keeps what it recorded, and the check that a path a command writes (an export, a
report's folder, a probe's CSV) is none of those folders and lies in none of them: written there,
it would sit among the store's files or replace them. ``recorded_places`` is the whole output
folder (an export, a probe's CSV: nothing of theirs belongs in it); ``record_folders`` the folders
in it that hold records (a report may have a folder of its own beside them)."""

from __future__ import annotations

from pathlib import Path

from ablate.study import Study
from ablate.tracking.store import sqlite_path


def recorded_places(study: Study) -> dict[str, Path]:
    """The folders that hold what ``study`` recorded, by what they are: its output folder (the
    SQLite store by default, its artifacts, the cells' checkpoints) and, for a SQLite store
    elsewhere (``tracking.uri``), the artifacts folder beside it."""
    return {"the study's output folder (--output)": study.output_dir, **_store_artifacts(study)}


def record_folders(study: Study) -> dict[str, Path]:
    """The folders inside ``study``'s output folder in which its records lie, by what they are:
    its cells' checkpoints (``cells/``), its branch checkpoints (``branches/``), its store's
    artifacts (and those beside a SQLite store elsewhere). The store itself is in the output folder;
    a folder of its own there holds nothing recorded (``make quickstart`` writes its report to
    ``runs/quickstart/report/``)."""
    return {
        "its cells' checkpoints": study.output_dir / "cells",
        "its branch checkpoints": study.output_dir / "branches",
        "the artifacts of its MLflow store": study.output_dir / "artifacts",
        **_store_artifacts(study),
    }


def _store_artifacts(study: Study) -> dict[str, Path]:
    """The artifacts folder beside the study's SQLite store, by what it is (none for a server)."""
    db = sqlite_path(study.tracking_uri)
    return (
        {}
        if db is None
        else {"the artifacts of its MLflow store (tracking.uri)": db.parent / "artifacts"}
    )


def place_holding(path: str | Path, places: dict[str, Path]) -> tuple[str, Path] | None:
    """The place (what it is, its resolved folder) that ``path`` is or lies in, symbolic links and
    ``..`` resolved on both sides; None when it is in none of ``places``."""
    target = Path(path).expanduser().resolve()
    for what, place in places.items():
        root = place.expanduser().resolve()
        if target == root or root in target.parents:
            return what, root
    return None
