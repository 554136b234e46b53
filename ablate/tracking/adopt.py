"""Adopting a study recorded before cell keys named the device kind and the resolved precision.

Keys used to hash the resolved config without them (and with ``train.checkpoint_every``), so every
cell of such a study has a new key now and would run again. ``adopt`` re-labels the old runs
instead: each cell whose old key (``legacy_config_hash``) has a run and whose new key
has none gets that run re-tagged with the new key (the old one kept as ``ablate.legacy_key``), and
its checkpoint folder renamed and re-keyed, so ``ablate run`` skips or resumes it as before.
Adopting asserts that those runs trained on the device kind and precision the study now resolves
to (``env.device`` and ``env.precision`` are recorded with ``env.adopted``); if they did not,
let them rerun instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ablate.key import digest
from ablate.spec.study import Cell, Study
from ablate.tracking import vocab
from ablate.tracking.runs import StudyTracker
from ablate.train.checkpoint import rekey_checkpoint
from ablate.train.config import RunConfig, device_kind, resolved_precision

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


def adoptable(study: Study, tracker: StudyTracker) -> list[Adoption]:
    """The cells whose run is recorded only under their old key."""
    runs = tracker.cell_runs()
    out = []
    for c in study.cells:
        old = legacy_config_hash(c.config)
        if c.key in runs or old not in runs or old == c.key:
            continue
        run = runs[old]
        ckpt = (study.output_dir / "cells" / old).exists()
        out.append(Adoption(c, old, run.run_id, run.status, ckpt))
    return out


def adopt(study: Study, tracker: StudyTracker, found: list[Adoption]) -> None:
    """Re-tag each run with its cell's new key and move its checkpoint to the new key's folder."""
    for a in found:
        kind = device_kind(a.cell.config.device)
        tracker.set_raw_tags(
            a.run_id,
            {
                vocab.KEY: a.cell.key,
                vocab.tag("legacy_key"): a.old_key,
                vocab.env_tag("device"): kind,
                vocab.env_tag("precision"): resolved_precision(a.cell.config.train.precision, kind),
                vocab.env_tag("adopted"): "true",
            },
        )
        if a.checkpoint:
            old_dir: Path = study.output_dir / "cells" / a.old_key
            new_dir = study.checkpoint_dir(a.cell)
            old_dir.rename(new_dir)
            rekey_checkpoint(new_dir, a.cell.key)
