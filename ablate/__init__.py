"""ablate: controlled ablation studies of FP4/FP8 LLM training recipes.

The numerics live in the sibling package ``backends``; this package holds the tool around them
(CLI, and later the study spec, trainer, runner, tracking, report and tune).
"""

__version__ = "0.1.0"
