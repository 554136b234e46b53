"""The study spec (a package: ``schema``, ``expand``, ``errors``): YAML -> typed ``StudySpec`` (pydantic) -> ``Study`` with its expanded cells.

A study is a base configuration plus axes. An axis is a recipe shorthand (``fp4_gemms``,
``intervention``, ``fp4_format``, ``base_format``, ``scale_mode``, ``apply_to``, ``keep_first``,
``keep_last``), ``seed``, ``backend``, or any dotted config path (``train.lr``, ``model.preset``,
``data.data_seed``). ``grid`` is one mapping of axes (their cartesian product) or a list of them (the
union of their products); inside a grid, ``zip`` holds axes that vary together. ``exclude`` removes
cells, ``baseline`` selects the configuration others are compared with.

Each cell resolves into a full ``RunConfig``. Its **key** is a hash of that resolved config (where it
runs and where it checkpoints do not count), so YAML key order, spelling of defaults and the grid that
produced it do not matter, and a changed config gets a new key. Its **label** reads like the recipe
(``mxfp4[fprop,dgrad,wgrad]+dht16/fp8``) plus the other axes that vary (``lr=0.001``) and the seed.

Everything is checked here, before Ray starts or anything is written: unknown keys and axes, wrong
types, misspelled interventions, impossible combinations, an empty grid, a baseline or exclusion that
matches no cell, missing data files. ``SpecError`` carries one message per problem, each starting
with the YAML path (``grid.intervention[2]``) and naming the allowed values.
"""

from .errors import SpecError, did_you_mean, pydantic_errors
from .expand import (
    Cell,
    Study,
    check_axis_name,
    fmt_value,
    load_study,
    parse_study,
    with_values,
)
from .schema import (
    LIST_AXES,
    RECIPE_AXES,
    SECTIONS,
    TOP_AXES,
    CellConfig,
    Resources,
    StudySpec,
    Target,
    Tracking,
    json_schema,
)

__all__ = [
    "LIST_AXES",
    "RECIPE_AXES",
    "SECTIONS",
    "TOP_AXES",
    "Cell",
    "CellConfig",
    "Resources",
    "SpecError",
    "Study",
    "StudySpec",
    "Target",
    "Tracking",
    "check_axis_name",
    "did_you_mean",
    "fmt_value",
    "json_schema",
    "load_study",
    "parse_study",
    "pydantic_errors",
    "with_values",
]
