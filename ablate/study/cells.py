"""A study once expanded: its ``Cell``s (key, labels, resolved config) and the ``Study`` that holds
them with where its results go (output folder, MLflow store and experiment, checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.study.baseline_from import BaselineSource
from ablate.study.schema import StudyFile, Target
from ablate.study.seeds import SeedPlan
from ablate.train.config import RunConfig


@dataclass(frozen=True)
class Cell:
    key: str
    """Hash of the resolved config (see module docstring)."""
    label: str
    """Readable name: the recipe, other varying axes, the seed."""
    config_label: str
    """The label without the seed: cells with equal config_label differ only by seed."""
    values: Mapping[str, Any]
    """Value of every axis of the study in this cell (resolved, canonical)."""
    config: RunConfig
    baseline: bool = False
    recipe_axes: Mapping[str, Any] = field(default_factory=dict)
    """The recipe in the study's vocabulary: fp4_gemms, intervention (canonical, e.g. dht16),
    fp4_format, base_format."""
    zipped: frozenset[str] = frozenset()
    """Axes zipped with an earlier axis of their group, which names them in a run's short name."""
    rung: str = ""
    """In a ladder study (``ablate.study.ladder``): the cell's (size, budget) as leaf=value parts;
    "" otherwise."""
    ladder_config: str = ""
    """In a ladder study: the configuration across rungs (the label without rung and seed)."""

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def extra_steps(self) -> int:
        """Steps this cell trains past the end of its schedule (a baseline under the study's
        ``baseline_extend``; 0 for every other cell)."""
        return self.config.train.steps - self.config.train.schedule_end

    @property
    def role(self) -> str:
        """What ``plan`` says of a baseline cell: ``baseline``, and how much longer it trains."""
        if not self.extra_steps:
            return "baseline"
        t = self.config.train
        return (
            f"baseline, trains {t.steps} steps: {self.extra_steps} past the budget of "
            f"{t.schedule_end}, at the final learning rate"
        )


@dataclass
class Study:
    file: StudyFile
    """The study file as written and validated."""
    cells: list[Cell]
    axes: list[str]
    """Every axis of the study, in order of first appearance."""
    output_dir: Path
    text: str = ""
    """The YAML as written (recorded with the study's parent run)."""
    source: str | None = None
    notes: list[str] = field(default_factory=list)
    """Things the user should know that are not errors (duplicate cells merged, defaults taken)."""
    baseline_source: BaselineSource | None = None
    """Where ``baseline_from`` points, resolved once when the study was read with its files
    checked (``expand.baseline_source``); None without ``baseline_from``, or not resolved yet."""

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def tracking_uri(self) -> str:
        if self.file.tracking.uri:
            return self.file.tracking.uri
        return "sqlite:///" + str((self.output_dir / "mlflow.db").resolve())

    @property
    def experiment(self) -> str:
        return self.file.tracking.experiment or self.file.name

    @property
    def sequential(self) -> SeedPlan | None:
        """The sequential seed plan (``seeds:``), or None for a study of fixed seeds."""
        return self.file.seeds

    @property
    def baseline_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.baseline]

    @property
    def extension_note(self) -> str | None:
        """One line on the baseline trained past the budget (``baseline_extend``), or None."""
        longer = [c for c in self.baseline_cells if c.extra_steps]
        if not longer:
            return None
        t = longer[0].config.train
        return (
            f"baseline_extend: {self.file.baseline_extend:g}: each baseline seed trains "
            f"{t.steps} steps, {t.steps / t.schedule_end:.2f}x the budget of "
            f"{t.schedule_end} (the same schedule up to it, then its final learning rate), so "
            "that the equal-loss ratio finds every configuration's final loss on their curves"
        )

    @property
    def target(self) -> Target | None:
        if self.file.target is not None:
            return self.file.target
        if self.file.baseline is not None:
            return Target(from_baseline="slowest")
        return None

    def data_cache(self) -> Path:
        """The folder of prepared data (``data_cache``, else ``ablate.data.prepared``'s default),
        absolute: cells on other nodes get this path."""
        from ablate.data import default_cache

        given = self.file.data_cache
        return (Path(given) if given else default_cache()).expanduser().resolve()

    def checkpoint_dir(self, cell: Cell) -> Path:
        return self.output_dir / "cells" / cell.key
