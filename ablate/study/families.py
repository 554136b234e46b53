"""A study's families of decay branches (``ablate.train.branch``): cells whose resolved configs
differ only in their budget (``train.steps``) and train the wsd schedule. A family's
trunk is the member that decays last (its longest budget); each other member is a branch that
starts from the trunk's state at its own decay start, so k budgets cost one run and k - 1 decays.
A member that decays from step 0 shares nothing and is no branch.

Precision schedules make families too (``schedule_families``): cells whose configs differ only in
their recipes and phases (``ablate.train.phases``) train the same steps, bits included, until
their recipes first differ (``ablate.train.branch.shared_prefix``): an FP8 warmup of MXFP4 is the
FP8 run up to the warmup's end, a BF16 tail is the run without it up to the tail. The trunk is a
cell that branches from no other (the fewest segments first, then the study's order); every other
cell with a prefix in common with a trunk branches from the trunk it shares the most steps with,
from the trunk's checkpoint at the step where they part. Its checkpoints are written under the
prefix's hash (``prefix_hash``), which the branch checks against its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ablate.key import digest
from ablate.study.cells import Cell
from ablate.train.branch import Branches, branch_point, family_hash, prefix_hash, shared_prefix
from ablate.train.phases import timeline


@dataclass(frozen=True)
class Family:
    key: str
    """``family_hash`` of its members: what their branch checkpoints are written under."""
    trunk: Cell
    branches: tuple[tuple[Cell, int], ...]
    """(cell, branch point: the step its decay starts), by branch point."""
    hashes: tuple[tuple[int, str], ...] = ()
    """A family of precision schedules: its checkpoints' hashes by step (``prefix_hash``);
    empty for a family of wsd budgets, whose checkpoints are all under ``key``."""

    @property
    def kind(self) -> str:
        """What its branches are: ``decay`` (wsd budgets) or ``schedule`` (precision schedules)."""
        return "schedule" if self.hashes else "decay"

    @property
    def points(self) -> tuple[int, ...]:
        """The steps at which the trunk saves a branch checkpoint (each once)."""
        return tuple(sorted({b for _, b in self.branches}))

    def point(self, cell: Cell) -> int | None:
        """The step ``cell`` branches off at (None: the trunk, or not a member)."""
        return next((b for c, b in self.branches if c.key == cell.key), None)

    @property
    def budget_steps(self) -> int:
        """The members' steps summed: what training each from step 0 costs."""
        return self.trunk.config.train.steps + sum(c.config.train.steps for c, _ in self.branches)

    @property
    def trained_steps(self) -> int:
        """The steps trained with branches: the trunk, then each branch's decay."""
        return self.trunk.config.train.steps + sum(
            c.config.train.steps - b for c, b in self.branches
        )

    def branches_of(self, cell: Cell, output_dir: Path) -> Branches:
        """What the trainer of member ``cell`` gets: the trunk saves every branch point, a branch
        starts from its own."""
        root = str(branch_root(output_dir, self.key).resolve())
        if cell.key == self.trunk.key:
            return Branches(root=root, family=self.key, save_at=self.points, hashes=self.hashes)
        point = self.point(cell)
        hashes = tuple(h for h in self.hashes if h[0] == point)
        return Branches(root=root, family=self.key, start_at=point, hashes=hashes)


def families(cells: Iterable[Cell]) -> list[Family]:
    """The families among ``cells`` (those of two members or more), in order of their trunks."""
    groups: dict[str, list[tuple[Cell, int]]] = {}
    for c in cells:
        b = branch_point(c.config)
        if b is not None:
            groups.setdefault(family_hash(c.config), []).append((c, b))
    out = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: (m[1], m[0].config.train.steps))
        (trunk, _), branches = members[-1], members[:-1]
        out.append(Family(key, trunk, tuple(branches)))
    return out


def schedule_families(cells: Iterable[Cell], taken: Iterable[str] = ()) -> list[Family]:
    """The families of precision schedules among ``cells`` (those in ``taken``, the wsd families'
    members, left out), in order of their trunks."""
    skip = set(taken)
    cand = [c for c in cells if c.key not in skip]

    def segments(c: Cell) -> int:
        return len(timeline(c.config.phases, c.config.recipe, c.config.train.steps))

    trunks: list[Cell] = []
    branches: dict[str, list[tuple[Cell, int]]] = {}
    for c in sorted(cand, key=segments):  # stable: the study's order among equals
        shared = [(shared_prefix(t.config, c.config), -i, t) for i, t in enumerate(trunks)]
        best = max(shared, default=(0, 0, c), key=lambda x: x[:2])
        if 0 < best[0] < c.config.train.steps:
            branches.setdefault(best[2].key, []).append((c, best[0]))
        else:
            trunks.append(c)
    out = []
    for t in trunks:
        if t.key not in branches:
            continue
        members = tuple(sorted(branches[t.key], key=lambda m: m[1]))
        points = sorted({b for _, b in members})
        hashes = tuple((b, prefix_hash(t.config, b)) for b in points)
        out.append(Family(digest({"schedule_trunk": t.key}), t, members, hashes))
    return out


def branch_root(output_dir: Path, key: str) -> Path:
    """The folder of family ``key``'s branch checkpoints in a study's output folder."""
    return output_dir / "branches" / key
