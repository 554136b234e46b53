"""Adopting a study's runs recorded under an older key, knowingly: ``ablate adopt``.

A cell's key changes when what it holds changes: before keys named the device kind and the
resolved precision (``legacy_config_hash``: the resolved config with ``train.checkpoint_every``),
and at every bump of the numerics version (``ablate.numerics``: ``config_hash(cfg, numerics=v)``
for each older ``v``). Such a study's cells would all run again; ``adopt`` re-labels the old runs
instead: each cell whose current key has no run and one of its older keys has one gets that run
re-tagged with the current key (the old one kept as ``ablate.legacy_key``) and its checkpoint
folder renamed and re-keyed (a one-process checkpoint's ``checkpoint.pt``, a sharded one's train
state, and the sidecar), so ``ablate run`` skips or resumes it. Every checkpoint to move is read
first (a one-process one unpickled, its tensors mapped; a sharded one checked as rank 0 checks it
before a run loads it): one that cannot be (refused, damaged, or a read the file system failed)
stops it before anything is adopted, naming the cell and the file (``AdoptError``).

Adopting asserts that those runs trained on the device kind and precision the study now resolves
to (``env.device`` and ``env.precision`` are recorded with ``env.adopted``). A run of an older
numerics version keeps its version (``env.numerics``), so ``ablate report`` does not compare it
with runs of the current one unless told to; only a run that ended is adopted across numerics
(an unfinished one would resume with other numerics and mix two in one run: it runs again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AdoptError, CheckpointError, TrackingError
from ablate.key import digest
from ablate.numerics import NUMERICS_VERSION
from ablate.study.cells import Cell, Study
from ablate.tracking import vocab
from ablate.tracking.runs import StudyTracker
from ablate.train.checkpoint import (
    CHECKPOINT,
    SHARDED,
    SINGLE_KEYS,
    checkpoint_info,
    load_file,
    rekey_checkpoint,
    sharded_damage,
)
from ablate.train.config import RunConfig, config_hash, device_kind, resolved_precision

LEGACY_TRAIN = (
    "steps", "batch_size", "grad_accum", "seq_len", "lr", "min_lr_ratio", "warmup_steps",
    "weight_decay", "beta1", "beta2", "eps", "grad_clip", "eval_every", "eval_batches",
    "checkpoint_every", "precision", "divergence_factor",
)  # fmt: skip
"""The ``train`` fields of that time: a field added since is in no legacy key."""
LEGACY_DATA = (
    "corpus", "path", "text_field", "hf_dataset", "hf_config", "hf_split", "max_documents",
    "tokenizer", "token_dtype", "val_tokens", "data_seed",
)  # fmt: skip
LEGACY_MODEL = (
    "preset", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len",
    "rope_theta", "norm_eps", "tie_embeddings", "head_dim", "hf", "init",
)  # fmt: skip
"""(``head_dim``, ``hf`` and ``init`` are in ``ModelConfig.to_dict`` only where set, as they were.)"""


def legacy_config_hash(cfg: RunConfig) -> str:
    """The key cells had before keys included the device kind and precision (and still counted
    ``train.checkpoint_every``): what ``ablate adopt`` looks for in a study recorded then."""
    d = cfg.to_dict()
    return digest(
        {
            "model": {k: v for k, v in d["model"].items() if k in LEGACY_MODEL},
            "data": {k: v for k, v in d["data"].items() if k in LEGACY_DATA},
            "train": {k: v for k, v in d["train"].items() if k in LEGACY_TRAIN},
            "recipe": d["recipe"],
            "backend": d["backend"],
            "seed": d["seed"],
        }
    )


@dataclass(frozen=True)
class Adoption:
    cell: Cell
    old_key: str
    run_id: str
    status: str
    checkpoint: bool
    """Whether a checkpoint was found under the old key (moved to the new one)."""
    numerics: int = NUMERICS_VERSION
    """The numerics version the run trained with."""


def older_keys(cfg: RunConfig) -> list[tuple[str, int]]:
    """(key, numerics version) a cell had before its current key, newest first: each older
    numerics version's, then the legacy key (numerics 1, before keys named the device kind)."""
    out = [(config_hash(cfg, numerics=v), v) for v in range(NUMERICS_VERSION - 1, 0, -1)]
    return out + [(legacy_config_hash(cfg), 1)]


def adoptable(study: Study, tracker: StudyTracker) -> tuple[list[Adoption], list[Adoption]]:
    """(the runs to adopt, those left to run again): each cell whose current key has no run and an
    older key has one; across numerics versions only a run that ended is adopted."""
    runs = tracker.cell_runs()
    adopt_: list[Adoption] = []
    rerun: list[Adoption] = []
    for c in study.cells:
        if c.key in runs:
            continue
        for old, version in older_keys(c.config):
            if old in runs and old != c.key:
                run = runs[old]
                ckpt = (study.output_dir / "cells" / old).exists()
                a = Adoption(c, old, run.run_id, run.status, ckpt, version)
                ok = version == NUMERICS_VERSION or run.status in vocab.ENDED
                (adopt_ if ok else rerun).append(a)
                break
    return adopt_, rerun


def adopt(study: Study, tracker: StudyTracker, found: list[Adoption]) -> None:
    """Re-tag each run with its cell's current key (and its numerics version) and move its
    checkpoint to the current key's folder, re-keyed. Every checkpoint to move is read first
    (``_read``), so that one that cannot be read (refused, damaged, or a read the file system
    failed: ``OSError``) fails the adoption before anything is adopted; each cell's checkpoint is
    then re-keyed before its folder moves and its run is re-tagged, so that a cell is adopted whole
    or not at all. ``AdoptError`` naming the cell and the file; or, where the store refuses to
    re-tag a run (deleted meanwhile), the cell, the run, where its checkpoint now is and how many
    runs were adopted before it (``_untagged``)."""
    for a in found:
        with _adopting(a):
            if a.checkpoint:
                _read(study.output_dir / "cells" / a.old_key)
    for n, a in enumerate(found):
        old_dir: Path = study.output_dir / "cells" / a.old_key
        if a.checkpoint:  # the checkpoint first, under the old name: then the run
            with _adopting(a, adopted=n):
                rekey_checkpoint(old_dir, a.cell.key)
                old_dir.rename(study.checkpoint_dir(a.cell))
        kind = device_kind(a.cell.config.device)
        tags = {
            vocab.KEY: a.cell.key,
            vocab.tag("legacy_key"): a.old_key,
            vocab.env_tag("device"): kind,
            vocab.env_tag("precision"): resolved_precision(a.cell.config.train.precision, kind),
            vocab.env_tag("numerics"): str(a.numerics),
            vocab.env_tag("adopted"): "true",
        }
        try:
            tracker.set_raw_tags(a.run_id, tags)
        except TrackingError as e:  # the store's refusal (a run deleted meanwhile, a store gone)
            raise AdoptError(_untagged(study, a, e, adopted=n)) from None


def _untagged(study: Study, a: Adoption, e: Exception, *, adopted: int) -> str:
    """What a failure to re-tag ``a``'s run says: the cell, the run, where its checkpoint is now
    (already moved and re-keyed), how many runs were adopted before it, and what to do."""
    where = f"; its checkpoint is under the new key already ({study.checkpoint_dir(a.cell)})"
    before = f"; {adopted} runs adopted before it" if adopted else ""
    return (
        f"{a.cell.label}: not adopted: its run {a.run_id} could not be re-tagged ({e})"
        f"{where if a.checkpoint else ''}{before}; adopt again for the rest"
    )


def _read(checkpoint_dir: Path) -> None:
    """Read the checkpoint in ``checkpoint_dir`` as ``rekey_checkpoint`` and then a resumed run read
    it: its sidecar (a read the file system fails raised); a one-process one's ``checkpoint.pt``
    unpickled as ``checkpoint_step`` reads it (its tensors mapped, not read); a sharded one as rank 0
    checks it before its ranks load it (``sharded_damage``: its train state, RNG states and DCP
    metadata unpickled as untrusted, its shards' sizes; no shard read). Raises what is damaged
    (``DamagedCheckpointError``), refused (``CheckpointError``) or failed (``OSError``)."""
    info = checkpoint_info(checkpoint_dir, strict=True)
    if info is not None and info.get("format") == SHARDED:
        damaged = sharded_damage(checkpoint_dir / info["path"])
        if damaged is not None:
            raise damaged
    elif (checkpoint_dir / CHECKPOINT).exists():
        load_file(checkpoint_dir / CHECKPOINT, keys=SINGLE_KEYS, mmap=True)


@contextlib.contextmanager
def _adopting(a: Adoption, adopted: int = 0) -> Iterator[None]:
    """``AdoptError`` naming ``a``'s cell (and the runs adopted before it) where its checkpoint is
    refused, damaged, or a read or rename of it fails."""
    try:
        yield
    except (CheckpointError, OSError) as e:
        before = f" ({adopted} runs adopted before it; adopt again for the rest)" if adopted else ""
        raise AdoptError(f"{a.cell.label}: not adopted: {e}{before}") from None
