"""Decay branches in ``ablate run`` and ``ablate plan`` (``ablate.study.families``,
``ablate.train.branch``): what each member of a family gets (``members``), where each cell to run
starts and what the study costs in steps trained (``start_step``, ``cost``, ``notes``), and the
runner's ``BranchGate``, which holds a branch until its trunk has saved the branch's checkpoint or
ended, and removes a branch checkpoint once every branch that starts there has a result. A branch whose trunk does not pass its branch point in this run is not held: it starts from
its checkpoint where one exists, else from step 0.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from ablate.driver.planning import TO_RUN, PlannedCell
from ablate.executor.task import Task
from ablate.study import Cell, Study
from ablate.study.families import Family, families, schedule_families
from ablate.train.branch import Branches
from ablate.train.checkpoint import checkpoint_step, remove_checkpoint


@dataclass(frozen=True)
class Member:
    """A cell of a family, and what its trainer gets."""

    family: Family
    cell: Cell
    branches: Branches

    @property
    def trunk(self) -> Cell | None:
        """A branch's trunk (None: this is the trunk)."""
        return None if self.cell.key == self.family.trunk.key else self.family.trunk

    @property
    def point(self) -> int | None:
        """A branch's branch point (None: the trunk)."""
        return self.family.point(self.cell)


def members(study: Study) -> dict[str, Member]:
    """Every member of the study's families, by cell key: of wsd budgets, then of precision
    schedules among the other cells."""
    out: dict[str, Member] = {}
    decays = families(study.cells)
    taken = {c.key for f in decays for c in (f.trunk, *(c for c, _ in f.branches))}
    for f in (*decays, *schedule_families(study.cells, taken)):
        for c in (f.trunk, *(c for c, _ in f.branches)):
            out[c.key] = Member(f, c, f.branches_of(c, study.output_dir))
    return out


def own_step(study: Study, p: PlannedCell) -> int:
    """The step a cell to run resumes from: its own checkpoint's (0: none, a sidecar's whose
    ``checkpoint.pt`` is missing too, a damaged one, or a rerun from 0)."""
    return 0 if p.fresh or p.damaged else checkpoint_step(study.checkpoint_dir(p.cell)) or 0


def trunk_passes(study: Study, trunk: PlannedCell, point: int) -> bool:
    """Whether the trunk trains through ``point`` in this run, saving the checkpoint there."""
    return trunk.action in TO_RUN and own_step(study, trunk) < point


def start_step(
    study: Study, p: PlannedCell, planned: dict[str, PlannedCell], m: Member | None
) -> int:
    """The step a cell to run starts from: its own checkpoint's; else a branch's point where its
    trunk saves that checkpoint in this run, or where it exists already, undamaged
    (``Branches.ready``; unless the branch reruns a stale result: such a checkpoint may be of the
    same older code); else 0 (and where its own checkpoint, or its branch checkpoint, is damaged:
    the run sets it aside and trains from step 0)."""
    own = own_step(study, p)
    if own or p.damaged or m is None or m.point is None or m.trunk is None:
        return own  # a damaged checkpoint set aside: from step 0, not from the branch point
    trunk = planned.get(m.trunk.key)
    if trunk is not None and trunk_passes(study, trunk, m.point):
        return m.point
    return m.point if m.branches.ready(m.point) and not p.fresh else 0


def cost(study: Study, planned: Iterable[PlannedCell]) -> tuple[int, int]:
    """(steps the cells to run train, their budgets' steps): with decay branches, a trunk and
    the branches' decays; without, each cell from where it stands."""
    planned = list(planned)
    by_key = {p.cell.key: p for p in planned}
    ms = members(study)
    trained = budgets = 0
    for p in planned:
        if p.action in TO_RUN:
            steps = p.cell.config.train.steps
            trained += steps - start_step(study, p, by_key, ms.get(p.cell.key))
            budgets += steps - own_step(study, p)
    return trained, budgets


def notes(study: Study, planned: Iterable[PlannedCell]) -> dict[str, str]:
    """What ``plan`` says of each member of a family, by cell key."""
    planned = list(planned)
    by_key = {p.cell.key: p for p in planned}
    out: dict[str, str] = {}
    for key, m in members(study).items():
        kind = "decay" if m.family.kind == "decay" else "schedule"
        if m.trunk is None:
            n = len(m.family.branches)
            points = ", ".join(map(str, m.family.points))
            at = f"step{'s' if len(m.family.points) > 1 else ''} {points}"
            out[key] = f"trunk of {n} {kind} branch{'es' if n > 1 else ''}: checkpoints at {at}"
            continue
        p = by_key.get(key)
        here = f"{kind} branch of {m.trunk.key} from step {m.point}"
        if kind == "schedule":
            here += ", the trunk's steps before it"
        if p is not None and p.action in TO_RUN and p.damaged:
            here += ": its own checkpoint damaged (set aside): from step 0"
        elif p is not None and p.action in TO_RUN and start_step(study, p, by_key, m) == 0:
            if m.point is not None and not p.fresh and m.branches.damage(m.point):
                here += ": its checkpoint there damaged (set aside): from step 0"
            else:
                here += ": no checkpoint there, and its trunk does not pass it now: from step 0"
        out[key] = here
    return out


class BranchGate:
    """The runner's hold on decay branches: a branch whose trunk runs now waits until the trunk has
    saved its branch checkpoint (Ray runs it then, beside the trunk) or has ended (then it starts
    from its checkpoint or, without one, from step 0). And their clean-up: a branch checkpoint
    goes once every branch that starts there has a result (``done``), so that a ladder of large
    models does not keep a full checkpoint per budget."""

    def __init__(self, ms: dict[str, Member] | None = None, done: Collection[str] = ()) -> None:
        self._held: list[tuple[Task, Branches, str]] = []
        self._members = ms or {}
        self._done = set(done)
        """Keys of the cells with a result: finished or diverged."""

    def hold(self, task: Task, branches: Branches, trunk: str) -> None:
        self._held.append((task, branches, trunk))

    def release(self, ended: Collection[str], *, everything: bool = False) -> list[Task]:
        """The held tasks whose trunk (by key) is in ``ended`` or has saved their checkpoint."""
        out: list[Task] = []
        kept: list[tuple[Task, Branches, str]] = []
        for held in self._held:
            task, b, trunk = held
            point = b.start_at
            if everything or trunk in ended or (point is not None and b.ready(point)):
                out.append(task)
            else:
                kept.append(held)
        self._held = kept
        return out

    def ended(self, key: str, status: str) -> list[Path]:
        """Note how cell ``key`` ended; remove (and return) the branch checkpoints that no branch
        needs any more: every branch that starts there has a result. (One that failed may be
        rerun: it starts from its own checkpoint, or from step 0.)"""
        if status not in ("finished", "diverged"):
            return []
        self._done.add(key)
        needed: dict[Path, bool] = {}
        for m in self._members.values():
            if m.point is not None:
                d = m.branches.dir(m.point)
                needed[d] = needed.get(d, False) or m.cell.key not in self._done
        spent = [d for d, need in needed.items() if not need and d.exists()]
        for d in spent:
            remove_checkpoint(d)
            shutil.rmtree(d, ignore_errors=True)
        return spent

    def clear(self) -> None:
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)
