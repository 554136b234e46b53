"""ablate: controlled ablation studies of FP4/FP8 LLM training recipes.

The numerics live in the sibling package ``backends``; this package holds the tool around them: the
study (``study``), the trainer (``train``), where cells run (``executor``), ``ablate run``
(``runner``), MLflow (``tracking``), the report (``report``), ``ablate tune`` (``tune``), the
exceptions (``errors``) and the command line (``cli``). ``docs/architecture.md`` says what each
owns and may import.
"""

__version__ = "0.1.0"
