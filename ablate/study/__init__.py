"""The study: YAML -> typed ``StudyFile`` (pydantic) -> ``Study`` with its expanded cells.

Modules, by concept:

    loader    a study file read safely: strict UTF-8, YAML with limits, duplicate keys refused
    schema    pydantic models of a study file: StudyFile, CellConfig (its intervention parsed once,
              ``backends.recipes.intervention``), Target, Resources, TuneSection
    recipe    the recipe vocabulary beyond the shorthands: named, explicit per-GEMM, layer
              selection; a resolved recipe in the report's terms (recipe_axes)
    override  partial overrides of a named recipe, by GEMM and operand
    phases    precision schedules in the study's words: warmup and tail sections, the trainer's
              phases of them, their segments in the report's terms
    schedules  the submitted runs' precision schedules by name (``schedule: NAME``)
    speedup   the ``speedup:`` section and the named device table it points at
    axes      axis names and dotted config paths (check_axis_name, with_values, fmt_value)
    cells     the expanded Study and its Cells
    grid      the expansion's first phases: axis values checked, the cells' axis values,
              exclusions, and how exclude/baseline match a cell
    expand    load_study / parse_study: validation, the expansion's phases (each cell resolved
              with the study's defaults, then keyed and labelled)
    families  cells that differ only in their wsd budget: a trunk and its decay branches; cells
              whose precision schedules share a prefix: a trunk and its schedule branches
    ladder    the ``ladder:`` section: sizes and budgets compared rung by rung, where to predict
    rungs     each cell's rung and configuration across rungs; what makes a ladder unfittable
    tune      the ``tune:`` section's searches and checks (plan_searches, trial_config, check_tune)
    seeds     the ``seeds:`` section: sequential seeds in waves instead of a seed axis
    baseline_from  the study or store whose runs of the baseline's keys are its seeds
    messages  pydantic's errors turned into ``yaml.path: what is wrong`` lines

A study is a base configuration plus axes. An axis is a recipe shorthand (``fp4_gemms``,
``intervention``, ``fp4_format``, ``base_format``, ``scale_mode``, ``apply_to``, ``keep_first``,
``keep_last``), ``seed``, ``backend``, or any dotted config path (``train.lr``, ``model.preset``,
``data.data_seed``, ``warmup.first``). ``grid`` is one mapping of axes (their cartesian product) or a list of them (the
union of their products); inside a grid, ``zip`` holds axes that vary together. ``exclude`` removes
cells, ``baseline`` selects the configuration others are compared with.

Each cell resolves into a full ``RunConfig``. Its **key** is a hash of that resolved config (where it
runs and where it checkpoints do not count), so YAML key order, spelling of defaults and the grid that
produced it do not matter, and a changed config gets a new key. Its **label** reads like the recipe
(``mxfp4[fprop,dgrad,wgrad]+dht16/fp8``) plus the other axes that vary (``lr=0.001``) and the seed.

Everything is checked here, before Ray starts or anything is written: unknown keys and axes, wrong
types, misspelled interventions, impossible combinations, an empty grid, a baseline or exclusion that
matches no cell, missing data files. ``StudyError`` carries one message per problem, each starting
with the YAML path (``grid.intervention[2]``) and naming the allowed values.

This ``__init__`` loads its modules on first attribute access, so ``ablate.study.speedup`` (which the
report imports) stays cheap: it does not pull in torch through the trainer's configs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from ablate.errors import StudyError
    from ablate.study.axes import check_axis_name, fmt_value, with_values
    from ablate.study.cells import Cell, Study
    from ablate.study.expand import load_study, parse_study
    from ablate.study.messages import did_you_mean, pydantic_errors
    from ablate.study.schema import (
        LIST_AXES,
        RECIPE_AXES,
        SECTIONS,
        TOP_AXES,
        CellConfig,
        Resources,
        StudyFile,
        Target,
        Tracking,
        TuneSection,
        json_schema,
    )
    from ablate.study.speedup import SpeedupSection
    from ablate.study.tune import Search, plan_searches, trial_config

_LAZY = {
    "StudyError": "..errors",
    "did_you_mean": ".messages",
    "pydantic_errors": ".messages",
    "Cell": ".cells",
    "Study": ".cells",
    "check_axis_name": ".axes",
    "fmt_value": ".axes",
    "with_values": ".axes",
    "load_study": ".expand",
    "parse_study": ".expand",
    "LIST_AXES": ".schema",
    "RECIPE_AXES": ".schema",
    "SECTIONS": ".schema",
    "TOP_AXES": ".schema",
    "CellConfig": ".schema",
    "Resources": ".schema",
    "StudyFile": ".schema",
    "Target": ".schema",
    "Tracking": ".schema",
    "TuneSection": ".schema",
    "json_schema": ".schema",
    "SpeedupSection": ".speedup",
    "Search": ".tune",
    "plan_searches": ".tune",
    "trial_config": ".tune",
}

__all__ = [
    "Cell",
    "CellConfig",
    "LIST_AXES",
    "RECIPE_AXES",
    "Resources",
    "SECTIONS",
    "Search",
    "StudyError",
    "SpeedupSection",
    "Study",
    "StudyFile",
    "TOP_AXES",
    "Target",
    "Tracking",
    "TuneSection",
    "check_axis_name",
    "did_you_mean",
    "fmt_value",
    "json_schema",
    "load_study",
    "parse_study",
    "plan_searches",
    "pydantic_errors",
    "trial_config",
    "with_values",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
