"""Decay branches: one warmup-stable-decay run trains several budgets of one configuration.

Runs of a config that differ only in their budget (``train.steps``, and ``schedule_steps`` when a
baseline trains past its schedule) and train the wsd schedule are one *family*: before its decay
(``TrainConfig.decay_start``) each of them is the same run, step for step, bits included. The
family's longest run, its *trunk*, saves a *branch checkpoint* at the decay start of every shorter
member; a shorter member, a *branch*, starts from that checkpoint and trains only its decay. It
ends bit-identical to the run trained to its budget from step 0 (tested), so it has that run's
key; where its checkpoint does not exist (the trunk failed or diverged before it, or never ran),
or is damaged (``Branches.ready``: as ``ablate plan`` finds it; ``Branches.loaded_start``: as its
load finds it, which the worker asks before it copies the trunk's curve; set aside beside itself
by ``load_branch``), it trains from step 0: the same numbers, only slower. A distributed branch's
ranks take rank 0's verdict.

Nothing before the decay reads ``steps``: the schedule holds ``lr`` there (``schedule``), the batch
order is a permutation per epoch (``ablate.data.batches``), the random streams count calls
(``backends.layer.streams``), the divergence guard reads ``warmup_steps``, and the evaluations
``steps`` adds (``TrainConfig.eval_due``: a budget's last step) come after its decay starts.

A branch checkpoint is an ordinary checkpoint (``ablate.train.checkpoint``: atomic, loaded as
untrusted) in ``<family folder>/step-<step>/``, written under the family's hash
(``family_hash``: the cell key with the budget left out) instead of a cell key, so that only a
member of its family loads it. ``Branches`` tells ``train`` what to save or where to start; the
driver makes it (``ablate.driver.branching``). A distributed family's branch checkpoints are
sharded (``checkpoint.save_sharded``): the trunk's ranks write them, and a branch's ranks, as many
(the worker count is in the key), read them, each its own shards and RNG states.

Precision schedules (``ablate.train.phases``) branch the same way at a different point: two runs
whose configs differ only in their recipes and phases are the same run until their recipes first
differ (``shared_prefix``). Their branch checkpoints are written under the hash of what was trained
up to them (``prefix_hash``: the key without recipe and phases, the recipes of the steps so far,
whether the model is converted), which the branch computes from its own config and must match.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ablate.data import BatchSampler
from ablate.errors import CheckpointError, DamagedCheckpointError
from ablate.key import digest, key_fields
from ablate.numerics import NUMERICS_VERSION
from ablate.train.checkpoint import (
    CHECKPOINT,
    SHARDED,
    checkpoint_info,
    load_checkpoint,
    load_sharded,
    save_checkpoint,
    save_sharded,
    set_aside,
)
from ablate.train.config import RunConfig, device_kind
from ablate.train.damage import checkpoint_damage, load_damage
from ablate.train.parallel import Ranks
from ablate.train.phases import prefix, quantizes, timeline
from ablate.train.state import TrainState


def family_hash(cfg: RunConfig, numerics: int = NUMERICS_VERSION) -> str:
    """The key of ``cfg`` with its budget left out (``train.steps``, ``train.schedule_steps``):
    equal for the members of one family, and what their branch checkpoints are written under."""
    d = key_fields(cfg, device_kind(cfg.device))
    for name in ("steps", "schedule_steps"):
        d["train"].pop(name, None)
    return digest({"family": d, "numerics": numerics})


def prefix_hash(cfg: RunConfig, step: int, numerics: int = NUMERICS_VERSION) -> str:
    """What ``cfg`` trains before optimizer step ``step`` (at most its schedule's end): its key
    with the recipe and phases replaced by the recipes of its steps up to there
    (``phases.prefix``), its budget by its schedule's, and whether its model is converted. Two
    runs with equal prefix hashes at ``step`` are the same run up to it, bits included: a
    precision schedule's branch starts from the other's checkpoint there."""
    d = key_fields(cfg, device_kind(cfg.device))
    for name in ("recipe", "phases", "quantizer_graph"):
        d.pop(name, None)
    # a run trained past its schedule (a baseline's baseline_extend) is, up to the schedule's
    # end, the run of that many steps
    d["train"]["steps"] = cfg.train.schedule_end
    d["train"].pop("schedule_steps", None)
    trained = prefix(cfg.phases, cfg.recipe, cfg.train.steps, step)
    converted = quantizes(cfg.phases, cfg.recipe) is not None
    return digest({"prefix": d, "timeline": trained, "converted": converted, "numerics": numerics})


def shared_prefix(a: RunConfig, b: RunConfig) -> int:
    """The steps two runs share from step 0 (``prefix_hash`` equal up to there): 0 where anything
    but their recipes and phases differs, else up to the first step their recipes differ."""
    if prefix_hash(a, 0) != prefix_hash(b, 0):
        return 0
    ta = timeline(a.phases, a.recipe, a.train.steps)
    tb = timeline(b.phases, b.recipe, b.train.steps)
    shared, i, j = 0, 0, 0
    while i < len(ta) and j < len(tb) and ta[i][2].to_dict() == tb[j][2].to_dict():
        shared = min(ta[i][1], tb[j][1])
        i, j = i + (ta[i][1] == shared), j + (tb[j][1] == shared)
    return min(shared, a.train.schedule_end, b.train.schedule_end)


def branch_point(cfg: RunConfig) -> int | None:
    """The step a budget branches off its family's trunk: its decay start (None: not a wsd
    run, or one that decays from step 0 and so shares nothing)."""
    start = cfg.train.decay_start
    if start is None or start < 1:
        return None
    return start


@dataclass(frozen=True, slots=True)
class Branches:
    """What a member of a family does with branch checkpoints: the trunk saves one at each step of
    ``save_at``; a branch starts from the one at ``start_at`` when it has no checkpoint of its own.
    Plain data: it travels to workers as ``to_dict()``."""

    root: str
    """The family's folder of branch checkpoints."""
    family: str
    """The family's hash (``family_hash``): the config hash its branch checkpoints hold."""
    save_at: tuple[int, ...] = ()
    """Trunk: the steps where shorter budgets branch off."""
    start_at: int | None = None
    """Branch: its branch point (its decay start)."""
    hashes: tuple[tuple[int, str], ...] = ()
    """A family of precision schedules (``prefix_hash``): the hash of each branch checkpoint by
    its step, as the driver computed it from the trunk (the run checks its own against it).
    Empty: a family of wsd budgets, every checkpoint under ``family``."""

    def hash_at(self, step: int) -> str:
        """The config hash the branch checkpoint at ``step`` is written under."""
        return dict(self.hashes).get(step, self.family)

    def dir(self, step: int) -> Path:
        """The folder of the branch checkpoint at ``step``."""
        return Path(self.root) / f"step-{step:09d}"

    def ready(self, step: int) -> bool:
        """Whether the branch checkpoint at ``step`` exists, of this family and that step (read from
        its sidecar, whose ``checkpoint.pt`` must be there: as ``checkpoint_step`` reads it), and is
        not damaged as the ends of its files show (``damage``): so ``ablate plan`` and the run
        agree where the branch starts. What only a load finds the run finds (``load_branch``), and
        the worker before it copies the trunk's curve (``loaded_start``)."""
        info = self._named(step)
        return info is not None and checkpoint_damage(self.dir(step), info) is None

    def damage(self, step: int) -> str | None:
        """Why the branch checkpoint at ``step`` of this family and that step is damaged, from the
        ends of its files (``damage.checkpoint_damage``, milliseconds), or None: not damaged so, or
        none there. A damaged one is not ``ready``: the branch trains from step 0, and its run sets
        the checkpoint aside (``load_branch``)."""
        info = self._named(step)
        return None if info is None else checkpoint_damage(self.dir(step), info)

    def _named(self, step: int) -> dict[str, Any] | None:
        """The sidecar at ``step`` (read once) where it names a checkpoint of this family and that
        step whose files are there (``checkpoint_step``: a one-process one's ``checkpoint.pt``),
        else None."""
        d = self.dir(step)
        info = checkpoint_info(d)
        if info is None or info.get("config_hash") != self.hash_at(step) or info["step"] != step:
            return None
        return info if info.get("format") == SHARDED or (d / CHECKPOINT).exists() else None

    def loaded_start(self) -> int | None:
        """``start`` as the run finds it when it loads the checkpoint: also None where the load
        finds it damaged (``damage.load_damage``: a pickle garbled behind a sound zip directory,
        which the ends of its files do not show), which the run then sets aside and trains from
        step 0 (``load_branch``). The worker copies the trunk's curve up to this step only."""
        at = self.start_at
        info = None if at is None else self._named(at)
        if at is None or info is None or checkpoint_damage(self.dir(at), info) is not None:
            return None
        return at if load_damage(self.dir(at), info) is None else None

    @property
    def start(self) -> int | None:
        """The step a branch starts from now: ``start_at`` where its checkpoint is ready, else
        None (it trains from step 0)."""
        return self.judged()[0]

    def judged(self) -> tuple[int | None, str | None]:
        """``start`` and, where it is None, ``damage(start_at)`` (None: not damaged, or none
        there), from one read of the sidecar."""
        at = self.start_at
        info = None if at is None else self._named(at)
        if at is None or info is None:
            return None, None
        why = checkpoint_damage(self.dir(at), info)
        return (at, None) if why is None else (None, why)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "family": self.family,
            "save_at": list(self.save_at),
            "start_at": self.start_at,
            "hashes": [list(h) for h in self.hashes],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Branches:
        return cls(
            root=str(d["root"]),
            family=str(d["family"]),
            save_at=tuple(int(s) for s in d.get("save_at", ())),
            start_at=None if d.get("start_at") is None else int(d["start_at"]),
            hashes=tuple((int(s), str(h)) for s, h in d.get("hashes", ())),
        )

    def check(self, cfg: RunConfig) -> None:
        """ValueError unless ``cfg`` is a member of this family that can save or start here."""
        if self.hashes:
            self._check_prefix(cfg)
            return
        if family_hash(cfg) != self.family:
            raise ValueError(
                f"branches: {cfg.train.steps} steps of this config are not of family "
                f"{self.family} (its hash is {family_hash(cfg)})"
            )
        point = branch_point(cfg)
        if point is None:
            raise ValueError(
                "branches: only a wsd run that does not decay from step 0 has a family "
                "(train.schedule: wsd, train.decay_start > 0)"
            )
        if self.start_at is not None and self.start_at != point:
            raise ValueError(
                f"branches: a branch starts at its decay start ({point}), not at {self.start_at}"
            )
        late = [s for s in self.save_at if not 0 < s <= point]
        if late:
            raise ValueError(
                f"branches: the trunk saves only before its own decay (step {point}); "
                f"{late} are not"
            )

    def _check_prefix(self, cfg: RunConfig) -> None:
        steps = [*self.save_at, *([] if self.start_at is None else [self.start_at])]
        wrong = [s for s in steps if prefix_hash(cfg, s) != self.hash_at(s)]
        if wrong or not steps:
            raise ValueError(
                f"branches: this config does not train the family's shared prefix up to step(s) "
                f"{wrong or steps} (its recipes or its config differ there)"
            )


def save_branch(
    branches: Branches,
    *,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    ranks: Ranks | None = None,
) -> None:
    """The trunk: write the branch checkpoint of step ``state.step`` (atomic; the sidecar last, so
    that ``ready`` never sees half of one); sharded, and collective, when ``ranks`` is a
    distributed run's."""
    kw: dict[str, Any] = dict(state=state, model=model, optimizer=optimizer, sampler=sampler)
    path, config_hash = branches.dir(state.step), branches.hash_at(state.step)
    if ranks is not None and ranks.distributed:
        save_sharded(path, config_hash=config_hash, ranks=ranks, **kw)
    else:
        save_checkpoint(path, config_hash=config_hash, **kw)


def load_branch(
    branches: Branches,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    ranks: Ranks | None = None,
) -> TrainState | None:
    """A branch: restore model, optimizer, data position and RNG states from its branch checkpoint
    and return its state at the branch point; None (nothing restored) when there is none, or when
    it is damaged (``DamagedCheckpointError``: set aside beside itself, ``checkpoint.set_aside``):
    found so from the ends of its files (not ``ready``, ``Branches.damage``) or by its load (a
    sharded one by rank 0 before any rank loads it). A file that is not the family's checkpoint of
    that step is refused (``CheckpointError``). Sharded, and collective, when ``ranks`` is a
    distributed run's: whether it starts from the checkpoint, or sets it aside, is rank 0's
    verdict on every rank (``_agreed_start``)."""
    step, why = _agreed_start(branches, ranks)
    if step is None:
        at = branches.start_at
        if at is not None and why is not None:  # as a load would find it: kept, set aside
            set_aside(branches.dir(at), DamagedCheckpointError(why), ranks)
        return None
    path = branches.dir(step)
    kw: dict[str, Any] = dict(model=model, optimizer=optimizer, sampler=sampler)
    try:
        if ranks is not None and ranks.distributed:
            state = load_sharded(path, config_hash=branches.hash_at(step), ranks=ranks, **kw)
        else:
            state = load_checkpoint(path, config_hash=branches.hash_at(step), **kw)
    except DamagedCheckpointError as e:  # as if there were none: the branch trains from step 0
        set_aside(path, e, ranks)  # distributed: every rank has rank 0's verdict, rank 0 renames
        return None
    except CheckpointError:
        raise
    except ValueError as e:  # another config's: never one ablate writes here
        raise CheckpointError(
            f"{path}: not a branch checkpoint of family {branches.family} ({e})"
        ) from None
    if state is not None and (state.step != step or state.status is not None):
        raise CheckpointError(
            f"{path}: holds step {state.step} ({state.status or 'training'}), not the branch "
            f"point {step} of a run in training; delete it to train the branch from step 0"
        )
    return state


def _agreed_start(branches: Branches, ranks: Ranks | None) -> tuple[int | None, str | None]:
    """Where the branch starts (``Branches.start``) and, where it does not, why its checkpoint
    there is damaged (``Branches.damage``; None: it is not, or there is none). In a distributed
    run (collective) rank 0's verdict, on every rank: ranks that judged it each (their file
    systems' views differ, or the trunk writes it meanwhile) could start one from the checkpoint
    and another from step 0. Where rank 0's check raises, every rank raises, none left waiting."""
    distributed = ranks is not None and ranks.distributed
    verdict: list[Any] = [None]
    failed: Exception | None = None
    if not distributed or (ranks is not None and ranks.leader):
        try:
            verdict = [branches.judged()]
        except Exception as e:  # noqa: BLE001 (raised below, on every rank)
            failed, verdict = e, [f"{type(e).__name__}: {e}"]
    if distributed:
        import torch.distributed as dist

        dist.broadcast_object_list(verdict, src=0)
    if failed is not None:
        raise failed
    if isinstance(verdict[0], str):
        raise OSError(
            f"{branches.root}: rank 0 failed to check its branch checkpoint ({verdict[0]})"
        )
    start, why = verdict[0]
    return start, why
