"""A study's families of decay branches (``ablate.train.branch``): cells whose resolved configs
differ only in their budget (``train.steps``) and train the wsd schedule in one process. A family's
trunk is the member that decays last (its longest budget); each other member is a branch that
starts from the trunk's state at its own decay start, so k budgets cost one run and k - 1 decays.
A member that decays from step 0 shares nothing and is no branch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ablate.study.cells import Cell
from ablate.train.branch import Branches, branch_point, family_hash


@dataclass(frozen=True)
class Family:
    key: str
    """``family_hash`` of its members: what their branch checkpoints are written under."""
    trunk: Cell
    branches: tuple[tuple[Cell, int], ...]
    """(cell, branch point: the step its decay starts), by branch point."""

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
            return Branches(root=root, family=self.key, save_at=self.points)
        return Branches(root=root, family=self.key, start_at=self.point(cell))


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


def branch_root(output_dir: Path, key: str) -> Path:
    """The folder of family ``key``'s branch checkpoints in a study's output folder."""
    return output_dir / "branches" / key
