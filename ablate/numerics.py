"""The numerics version: one integer that names the numbers this code computes.

A change that moves any trained number (a loss, a quantized value, a random stream) bumps it, in
the same commit that re-pins the golden trajectories (``tests/ablate/train/test_golden.py``) and
regenerates the kept reports. Every run records it (``env.numerics``) and every cell's key holds
it (``ablate.train.config.config_hash``), so a study resumed across a bump trains new cells
instead of mixing two sets of numbers in one comparison; ``ablate adopt`` takes over
runs of an older version knowingly, and ``ablate report`` refuses to compare cells of two
versions unless told to (``--mix-numerics``).

Version 1 is every run before the version existed (its keys hold no version). What each later
version changed:

    2   random streams hash the element index before the key enters (two keys' streams were the
        same numbers permuted); double-block NVFP4 divides where the reciprocal of its scale
        overflows (it gave NaN for blocks under about 1.8e-38)
"""

NUMERICS_VERSION = 2
"""The numerics of this code (see the module docstring)."""
FIRST_KEYED = 2
"""The first version a cell's key holds (version 1's keys hold none)."""
