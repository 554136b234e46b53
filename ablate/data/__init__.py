"""The training data: what a corpus is, how it becomes tokens once, and how a run reads them.

    from ablate.data import DataConfig, load_data
    data = load_data(DataConfig(corpus="builtin"))  # prepared once, then memory-mapped
    data.train, data.val, data.vocab_size

The way through, in the order a study takes it:

- ``config``: ``DataConfig`` and ``ValData``, each field checked when made;
- ``sources``: the files a corpus reads and its documents (``check_sources`` fails fast on
  missing inputs), and what of it decides its tokens; ``paths``: what a path a study names is
  (a file, a folder, or a named pipe, a device, a link loop, said as such), from its stat alone;
- ``tokenizer``: bytes or a Hugging Face tokenizer; ``tokenizing`` encodes documents in worker
  processes; ``corpus`` is the built-in corpus (Python's own documentation);
- ``prepared``: a data configuration tokenized once into memory-mappable files keyed by its
  fingerprint (``prepare``, ``already_prepared``, ``check_counts``), and ``load_data``, which maps
  them for a run (``TokenData``); ``manifest``: a prepared set's layout on disk and its checks
  (``check_set``: a damaged set is rebuilt, never trained on);
- ``batches``: the seeded, resumable order of training windows and the fixed validation batches.

It imports torch and numpy only; the trainer, the study and the driver import it. This ``__init__``
loads its modules on first attribute access: only ``batches`` imports torch at import (``prepared``
when a set is mapped for a run), so a study loads and is checked against its data without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.lazy import lazy_getattr

if TYPE_CHECKING:
    from ablate.data.batches import BatchSampler, val_batches
    from ablate.data.config import SEED_LIMIT, DataConfig, ValData
    from ablate.data.prepared import (
        Prepared,
        TokenData,
        already_prepared,
        check_counts,
        data_key,
        default_cache,
        load_data,
        prepare,
    )
    from ablate.data.sources import check_sources
    from ablate.data.tokenizer import load_tokenizer

_LAZY = {
    "BatchSampler": "ablate.data.batches",
    "val_batches": "ablate.data.batches",
    "SEED_LIMIT": "ablate.data.config",
    "DataConfig": "ablate.data.config",
    "ValData": "ablate.data.config",
    "Prepared": "ablate.data.prepared",
    "TokenData": "ablate.data.prepared",
    "already_prepared": "ablate.data.prepared",
    "check_counts": "ablate.data.prepared",
    "data_key": "ablate.data.prepared",
    "default_cache": "ablate.data.prepared",
    "load_data": "ablate.data.prepared",
    "prepare": "ablate.data.prepared",
    "check_sources": "ablate.data.sources",
    "load_tokenizer": "ablate.data.tokenizer",
}

__all__ = [
    "SEED_LIMIT",
    "BatchSampler",
    "DataConfig",
    "Prepared",
    "TokenData",
    "ValData",
    "already_prepared",
    "check_counts",
    "check_sources",
    "data_key",
    "default_cache",
    "load_data",
    "load_tokenizer",
    "prepare",
    "val_batches",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them is an error
    __getattr__ = lazy_getattr(__name__, _LAZY)
