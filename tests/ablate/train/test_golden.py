"""Golden trajectories (``golden.py``): a few cells' per-step training and validation losses equal
the pinned ones, bit for bit on the machine kind that pinned them and within ``RTOL`` elsewhere.

A failure means the numbers moved. If that was meant: bump ``NUMERICS_VERSION`` in
``ablate/numerics.py``, re-pin (``python tests/ablate/train/golden.py --write``), regenerate the
kept reports, and say so in the commit. If not, the change has a bug."""

from __future__ import annotations

import math

import pytest
from golden import CELLS, RTOL, digest, load, machine, trajectory

from ablate.numerics import NUMERICS_VERSION

FIX = (
    "the numbers moved: if meant, bump NUMERICS_VERSION (ablate/numerics.py), re-pin with "
    "`python tests/ablate/train/golden.py --write`, regenerate the kept reports and say so in the "
    "commit; if not, the change has a bug"
)


@pytest.fixture(scope="module")
def pinned():
    return load()


def test_the_pins_are_this_codes_numerics_version(pinned):
    assert pinned["numerics"] == NUMERICS_VERSION, (
        f"golden.json was pinned under numerics {pinned['numerics']}, the code is "
        f"{NUMERICS_VERSION}: re-pin (python tests/ablate/train/golden.py --write)"
    )
    assert pinned["history"][str(NUMERICS_VERSION)] == digest(pinned["cells"])
    assert set(pinned["cells"]) == set(CELLS)


@pytest.mark.parametrize("name", list(CELLS))
def test_a_cell_trains_its_pinned_trajectory(name, pinned):
    got = trajectory(CELLS[name]())
    want = pinned["cells"][name]
    exact = machine() == pinned["machine"]
    for series in ("train_loss", "val_loss"):
        a, b = got[series], want[series]
        assert len(a) == len(b), f"{name} {series}: {len(a)} values, pinned {len(b)}"
        for step, (x, y) in enumerate(zip(a, b, strict=True)):
            if exact:
                assert x == y, (
                    f"{name} {series}[{step}] = {x!r}, pinned {y!r} on this machine kind "
                    f"({machine()}): {FIX}"
                )
            else:
                assert math.isclose(x, y, rel_tol=RTOL), (
                    f"{name} {series}[{step}] = {x!r}, pinned {y!r} on {pinned['machine']} "
                    f"(here {machine()}; within {RTOL:g} expected across machine kinds): {FIX}"
                )
