"""Every cell of every study in ``studies/`` keeps its key, its label and the recipe in the report's
terms (``Cell.recipe_axes``), as ``study_cells.json`` records them; and a shorthand cell's written
``intervention`` means what its resolved recipe says it does (``recipe_axes`` reads the label from the
resolved GEMMs; the written word parsed and labelled by the same grammar must agree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.study import load_study
from ablate.study.axes import with_values
from ablate.study.recipe import recipe_axes
from ablate.study.schema import CellConfig
from ablate.train.config import config_hash
from backends.recipes.intervention import label, parse

ROOT = Path(__file__).resolve().parents[3]
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
RECORDED = json.loads((Path(__file__).parent / "study_cells.json").read_text())


def test_every_study_has_its_cells_recorded():
    assert {p.stem for p in STUDIES} == set(RECORDED)


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_cell_keeps_its_key_label_and_recipe_axes(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # studies name their files relative to the repository
    study = load_study(path, check_files=False)
    cells = {c.label: {"key": c.key, **c.recipe_axes} for c in study.cells}
    assert cells == RECORDED[path.stem]
    assert all(c.key == config_hash(c.config) for c in study.cells)


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_a_written_intervention_is_labelled_as_its_resolved_recipe(path, monkeypatch):
    # the report charges a cell's intervention to its FP4 GEMMs: the label read from the resolved
    # GEMMs is the one it needs; the word the study writes must say the same
    monkeypatch.chdir(ROOT)
    study = load_study(path, check_files=False)
    base = study.file.base.model_dump(mode="python")
    shorthand = 0
    for c in study.cells:
        cc = CellConfig.model_validate(with_values(base, dict(c.values)))
        if cc.recipe is not None or cc.gemms is not None:
            continue
        shorthand += 1
        written = {
            "fp4_gemms": "+".join(cc.fp4_gemms),
            "intervention": label(parse(cc.intervention.text)),
            "fp4_format": cc.fp4_format,
            "base_format": cc.base_format,
        }
        assert recipe_axes(c.config.recipe, cc.base_format) == written, c.label
    assert shorthand or path.stem in ("recipes", "recipes_gpu")
