"""``baseline_from:``: where a study's baseline seeds may already be recorded, and what that names.

A baseline cell is a keyed, deterministic run: the same key trains the same numbers wherever it
runs. So a study may name another study (its file) or another MLflow store whose cells with this
study's baseline keys serve as this study's baseline seeds; ``ablate run`` copies each such run
that is a result (finished or diverged) into this study's store instead of training it
(``ablate.driver.reuse``; ``expand.baseline_source`` resolves the source, once, into
``Study.baseline_source``), and trains the seeds it does not find there. As MLPerf keeps its
reference convergence points, but exact: a seed is reused only under its own key, so a baseline
of other numerics, data, budget or code numbers (the key holds them all) is never mixed in.

Written as a path, ``baseline_from: studies/quickstart.yaml`` (relative to the current directory,
as ``output`` is), or as a store, ``baseline_from: {uri: sqlite:///runs/q/mlflow.db, name:
quickstart}`` (``experiment`` where it is not the study's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class BaselineFrom(BaseModel):
    """Another study (``study``: its file) or store (``uri`` and ``name``) holding baseline seeds."""

    model_config = ConfigDict(extra="forbid")

    study: str | None = None
    """A study file: its tracking store (its ``tracking.uri``, else its output folder's) and name."""
    uri: str | None = None
    """An MLflow tracking URI (with ``name``): a store whose study file is not at hand."""
    name: str | None = None
    """The study's name in that store (with ``uri``)."""
    experiment: str | None = None
    """Its MLflow experiment, where it is not the study's name (with ``uri``)."""

    @model_validator(mode="before")
    @classmethod
    def _a_path(cls, v: Any) -> Any:
        return {"study": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _one_source(self) -> BaselineFrom:
        if (self.study is None) == (self.uri is None):
            raise ValueError(
                "name a study file (baseline_from: path/to/study.yaml) or a store "
                "(baseline_from: {uri: ..., name: ...}), one of the two"
            )
        if self.uri is not None and not self.name:
            raise ValueError(f"uri {self.uri!r} needs the study's name there: name: <study name>")
        if self.study is not None and (self.name or self.experiment):
            raise ValueError("name and experiment go with uri; a study file names its own")
        return self


@dataclass(frozen=True)
class BaselineSource:
    """A resolved ``baseline_from``: the store, the study's name and experiment there."""

    uri: str
    name: str
    experiment: str

    @property
    def label(self) -> str:
        return f"study {self.name} in {self.uri}"
