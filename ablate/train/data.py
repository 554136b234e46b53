"""Training data: ``DataConfig``, corpora from files and datasets, the held-out split, ``load_data``.

``load_data`` turns a ``DataConfig`` into a ``TokenData`` (train and validation token streams, the
vocabulary size and a fingerprint):

- corpora: the built-in one (``corpus.py``: Python's own documentation, no download; the default),
  local text / JSONL / Parquet files, Hugging Face datasets, and pre-tokenized binary shards;
- tokenizers (``tokenizer.py``): UTF-8 bytes (vocab 257 with EOS) or a Hugging Face ``tokenizer.json``;
- the split: the *last* ``val_tokens`` tokens of the stream are the fixed validation set, never
  trained on; everything before them is the training set;
- a fingerprint (sha256 of the token stream and the tokenizer name) that the loop logs, so results
  on different data never mix silently.

Batches live in ``batches.py`` (re-exported here). Optional packages (``pyarrow``, ``datasets``,
``tokenizers``) are imported only by the code that reads those formats.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import json
import os
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from glob import glob
from itertools import islice
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from .batches import BatchSampler, val_batches  # noqa: F401  (re-exported)
from .corpus import builtin_documents  # noqa: F401
from .tokenizer import (  # noqa: F401  (re-exported)
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    _import_optional,
    load_tokenizer,
)

Corpus = Literal["builtin", "text", "jsonl", "parquet", "hf", "tokens"]
TokenDtype = Literal["uint16", "uint32"]

# Corpora read from data.path, and the file extension a directory is searched for.
_FILE_EXT = {"text": ".txt", "jsonl": ".jsonl", "parquet": ".parquet", "tokens": ".bin"}
_TORCH_DTYPE = {"uint16": torch.uint16, "uint32": torch.uint32}


SEED_LIMIT = 2**32
"""Seeds (model and data order) are below this: every random stream they key accepts them."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where the training tokens come from, how they are split, and in what order they are seen."""

    corpus: Corpus = "builtin"
    """``builtin``: Python's documentation and docstrings, no download. ``text``: ``.txt`` files, one
    document each. ``jsonl``: one JSON object per line. ``parquet``: a string column. ``hf``: a Hugging
    Face dataset. ``tokens``: pre-tokenized ``.bin`` shards of raw little-endian token ids."""
    path: str | None = None
    """A file, a directory (its files with the corpus's extension, not recursive) or a glob
    (``**`` recurses). Required for text/jsonl/parquet/tokens; files are read in name order."""
    text_field: str = "text"
    """The JSON field, Parquet column or dataset column holding the text (jsonl, parquet, hf)."""
    hf_dataset: str | None = None
    """For corpus ``hf``: a hub name (``allenai/c4``) or a local directory written by
    ``Dataset.save_to_disk``."""
    hf_config: str | None = None
    """For corpus ``hf``: the dataset configuration (``en`` for C4)."""
    hf_split: str = "train"
    """For corpus ``hf``: the split to read."""
    max_documents: int | None = None
    """Read at most this many documents (all corpora but ``tokens``); ``None`` reads them all."""
    tokenizer: str = "byte"
    """``byte`` (UTF-8 bytes + EOS, vocab 257) or the path of a Hugging Face ``tokenizer.json``."""
    token_dtype: TokenDtype = "uint16"
    """Element type of the ``tokens`` shards; ``uint16`` holds vocabularies up to 65536."""
    val_tokens: int = 65536
    """Size of the fixed validation set, taken from the end of the token stream, never trained on."""
    data_seed: int = 0
    """Seed of the order of training batches; separate from the model initialization seed."""

    def __post_init__(self) -> None:
        corpora = get_args(Corpus)
        if self.corpus not in corpora:
            raise ValueError(
                f"data.corpus: unknown corpus {self.corpus!r}; expected one of {corpora}"
            )
        if self.corpus in _FILE_EXT and not self.path:
            raise ValueError(
                f"data.path: required for corpus {self.corpus!r} "
                f"(a file, a directory of {_FILE_EXT[self.corpus]} files, or a glob)"
            )
        if self.corpus not in _FILE_EXT and self.path is not None:
            hint = "; name the dataset in data.hf_dataset" if self.corpus == "hf" else ""
            raise ValueError(f"data.path: not used by corpus {self.corpus!r}{hint}")
        if self.corpus == "hf" and not self.hf_dataset:
            raise ValueError("data.hf_dataset: required for corpus 'hf' (e.g. 'allenai/c4')")
        if self.corpus != "hf" and (self.hf_dataset is not None or self.hf_config is not None):
            raise ValueError(
                f"data.hf_dataset/hf_config: only used by corpus 'hf', not {self.corpus!r}"
            )
        if not self.text_field:
            raise ValueError("data.text_field: must name a field, got an empty string")
        if self.max_documents is not None:
            if self.corpus == "tokens":
                raise ValueError(
                    "data.max_documents: shards of tokens have no documents; leave it unset"
                )
            if not _is_int(self.max_documents) or self.max_documents < 1:
                raise ValueError(
                    f"data.max_documents: must be None or >= 1, got {self.max_documents!r}"
                )
        if not self.tokenizer:
            raise ValueError("data.tokenizer: 'byte' or the path of a tokenizer.json, got ''")
        if self.token_dtype not in get_args(TokenDtype):
            raise ValueError(
                f"data.token_dtype: {self.token_dtype!r}; expected one of {get_args(TokenDtype)}"
            )
        if not _is_int(self.val_tokens) or self.val_tokens < 1:
            raise ValueError(f"data.val_tokens: must be an integer >= 1, got {self.val_tokens!r}")
        if not _is_int(self.data_seed) or not 0 <= self.data_seed < SEED_LIMIT:
            raise ValueError(
                f"data.data_seed: must be an integer in [0, 2^32), got {self.data_seed!r}"
            )


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# --- documents from files and datasets ---------------------------------------------------------


def _resolve_files(cfg: DataConfig) -> list[Path]:
    spec, ext = str(cfg.path), _FILE_EXT[cfg.corpus]
    if any(c in spec for c in "*?["):
        files = [Path(p) for p in glob(spec, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(spec):
        files = [p for p in Path(spec).iterdir() if p.is_file() and p.name.endswith(ext)]
    elif os.path.isfile(spec):
        files = [Path(spec)]
    else:
        raise FileNotFoundError(f"data.path: {spec!r} does not exist")
    if not files:
        raise FileNotFoundError(
            f"data.path: no files match {spec!r} (a directory is searched for *{ext})"
        )
    return sorted(files, key=str)


def check_sources(cfg: DataConfig) -> None:
    """Fail fast on inputs that do not exist (data files, tokenizer file), before any training
    starts; relative paths are taken from the current directory, as ``load_data`` takes them."""
    if cfg.corpus in _FILE_EXT:
        _resolve_files(cfg)
    if cfg.tokenizer != "byte" and not os.path.isfile(cfg.tokenizer):
        raise FileNotFoundError(
            f"data.tokenizer: {cfg.tokenizer!r} does not exist; give the path of a "
            "tokenizer.json or 'byte'"
        )


def _text_documents(files: list[Path]) -> Iterator[str]:
    for f in files:
        try:
            yield f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"data.path: {f} is not UTF-8 text ({e})") from e


def _jsonl_documents(files: list[Path], text_field: str) -> Iterator[str]:
    for f in files:
        with open(f, encoding="utf-8") as lines:
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"data.path: {f}:{lineno} is not a JSON object ({e})") from e
                text = row.get(text_field) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                    raise ValueError(
                        f"data.text_field: {f}:{lineno} has no string field {text_field!r} (has {keys})"
                    )
                yield text


def _parquet_documents(files: list[Path], text_field: str) -> Iterator[str]:
    pq = _import_optional("pyarrow.parquet", "pyarrow", "data.corpus='parquet'")
    for f in files:
        pf = pq.ParquetFile(f)
        if text_field not in pf.schema_arrow.names:
            raise ValueError(
                f"data.text_field: {f} has no column {text_field!r} (has {pf.schema_arrow.names})"
            )
        for batch in pf.iter_batches(columns=[text_field], batch_size=4096):
            yield from (t for t in batch.column(0).to_pylist() if t is not None)


def _hf_documents(cfg: DataConfig) -> Iterator[str]:
    datasets = _import_optional("datasets", "datasets", "data.corpus='hf'")
    name = str(cfg.hf_dataset)
    local = Path(name)
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        ds = datasets.load_from_disk(name)  # written by save_to_disk
        if isinstance(ds, datasets.DatasetDict):
            if cfg.hf_split not in ds:
                raise ValueError(
                    f"data.hf_split: {name} has no split {cfg.hf_split!r} (has {sorted(ds)})"
                )
            ds = ds[cfg.hf_split]
    elif cfg.max_documents is not None:
        # stream: a limited read of a hub dataset (C4 is hundreds of GB) fetches only what it uses
        stream = datasets.load_dataset(name, cfg.hf_config, split=cfg.hf_split, streaming=True)
        for row in islice(stream, cfg.max_documents):
            if cfg.text_field not in row:
                raise ValueError(
                    f"data.text_field: {name} has no column {cfg.text_field!r} (has {sorted(row)})"
                )
            if row[cfg.text_field] is not None:
                yield row[cfg.text_field]
        return
    else:
        ds = datasets.load_dataset(name, cfg.hf_config, split=cfg.hf_split, streaming=False)
    if cfg.text_field not in ds.column_names:
        raise ValueError(
            f"data.text_field: {name} has no column {cfg.text_field!r} (has {ds.column_names})"
        )
    if cfg.max_documents is not None:
        ds = ds.select(range(min(cfg.max_documents, len(ds))))
    yield from (t for t in ds[cfg.text_field] if t is not None)


def _documents(cfg: DataConfig, files: list[Path]) -> Iterator[str]:
    if cfg.corpus == "builtin":
        docs: Iterable[str] = builtin_documents()
    elif cfg.corpus == "text":
        docs = _text_documents(files)
    elif cfg.corpus == "jsonl":
        docs = _jsonl_documents(files, cfg.text_field)
    elif cfg.corpus == "parquet":
        docs = _parquet_documents(files, cfg.text_field)
    else:
        docs = _hf_documents(cfg)
    return islice((d for d in docs if d), cfg.max_documents)


def _encode(docs: Iterator[str], tok: Tokenizer) -> torch.Tensor:
    """Documents -> one int64 stream with ``eos_id`` between documents."""
    encode_batch = getattr(tok, "encode_batch", None)
    ids = array.array("q")
    first = True
    while chunk := list(islice(docs, 1024)):
        for doc_ids in encode_batch(chunk) if encode_batch else map(tok.encode, chunk):
            if not first:
                ids.append(tok.eos_id)
            ids.extend(doc_ids)
            first = False
    if not ids:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(ids, dtype=torch.int64).clone()


def _load_shards(files: list[Path], token_dtype: TokenDtype) -> torch.Tensor:
    """Memory-mapped shards concatenated in name order. One shard stays mapped; several are copied
    into memory at their stored width (2 or 4 bytes a token)."""
    dtype = _TORCH_DTYPE[token_dtype]
    width = dtype.itemsize
    parts = []
    for f in files:
        nbytes = f.stat().st_size
        if nbytes % width:
            raise ValueError(
                f"data.token_dtype: {f} has {nbytes} bytes, not a whole number of {token_dtype} tokens"
            )
        if nbytes:
            parts.append(torch.from_file(str(f), shared=False, size=nbytes // width, dtype=dtype))
    if not parts:
        return torch.empty(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _fingerprint(stream: torch.Tensor, tokenizer_name: str) -> tuple[str, int]:
    """sha256 (16 hex chars) of the tokenizer name and the stream as little-endian int64, whatever
    its stored width, so the same tokens from text or from shards match; and the largest id."""
    h = hashlib.sha256(tokenizer_name.encode() + b"\0")
    max_id = -1
    step = 1 << 22
    for start in range(0, stream.numel(), step):
        chunk = stream[start : start + step].to(torch.int64, copy=True)
        max_id = max(max_id, int(chunk.max()))
        # The chunk's raw bytes (bytes(storage) would walk them one Python int at a time).
        h.update(ctypes.string_at(chunk.data_ptr(), chunk.numel() * 8))
    return h.hexdigest()[:16], max_id


# --- loading -------------------------------------------------------------------------------------


@dataclass
class TokenData:
    """A tokenized corpus split into training tokens and the fixed validation tail."""

    train: torch.Tensor = field(repr=False)
    """1-D token ids: int64, or uint16/uint32 memory-mapped from a ``tokens`` shard."""
    val: torch.Tensor = field(repr=False)
    """The last ``val_tokens`` ids of the stream, same dtype as ``train``."""
    vocab_size: int
    fingerprint: str
    corpus_name: str
    tokenizer: Tokenizer = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Stream:
    tokens: torch.Tensor
    tokenizer: Tokenizer
    name: str
    fingerprint: str


# A study runs many cells in one process: keep the last few tokenized corpora.
_CACHE: OrderedDict[tuple[Any, ...], _Stream] = OrderedDict()
_CACHE_SIZE = 4


def clear_data_cache() -> None:
    """Forget the corpora ``load_data`` tokenized in this process."""
    _CACHE.clear()


def _corpus_name(cfg: DataConfig) -> str:
    if cfg.corpus == "builtin":
        name = f"builtin-py{sys.version_info[0]}.{sys.version_info[1]}"
    elif cfg.corpus == "hf":
        config = f"/{cfg.hf_config}" if cfg.hf_config else ""
        name = f"hf:{cfg.hf_dataset}{config}:{cfg.hf_split}"
    else:
        name = f"{cfg.corpus}:{cfg.path}"
    return name if cfg.max_documents is None else f"{name}[:{cfg.max_documents}]"


def _load_stream(cfg: DataConfig, files: list[Path]) -> _Stream:
    tok = load_tokenizer(cfg.tokenizer)
    if cfg.corpus == "tokens":
        if cfg.token_dtype == "uint16" and tok.vocab_size > 1 << 16:
            raise ValueError(
                f"data.token_dtype: 'uint16' cannot hold the {tok.vocab_size} ids of data.tokenizer "
                f"{cfg.tokenizer!r}; use 'uint32'"
            )
        tokens = _load_shards(files, cfg.token_dtype)
    else:
        tokens = _encode(_documents(cfg, files), tok)
    fingerprint, max_id = _fingerprint(tokens, tok.name)
    if max_id >= tok.vocab_size:
        raise ValueError(
            f"data.tokenizer: token id {max_id} in {_corpus_name(cfg)} is outside the vocabulary "
            f"({tok.vocab_size}) of {cfg.tokenizer!r}; wrong tokenizer or data.token_dtype?"
        )
    return _Stream(tokens, tok, _corpus_name(cfg), fingerprint)


def load_data(cfg: DataConfig, *, min_train_tokens: int = 4096) -> TokenData:
    """Tokenize (or map) the configured corpus and split it: the last ``cfg.val_tokens`` tokens are
    validation, the rest training. Raises if fewer than ``min_train_tokens`` are left to train on.

    Tokenized corpora are cached per process, keyed by the config (minus ``data_seed``, which only
    orders batches) and the size and mtime of the files read; callers must not modify the tensors.
    """
    files = _resolve_files(cfg) if cfg.corpus in _FILE_EXT else []
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    if cfg.tokenizer != "byte" and os.path.isfile(cfg.tokenizer):
        stats.append((cfg.tokenizer, 0, os.stat(cfg.tokenizer).st_mtime_ns))
    split_only = ("val_tokens", "data_seed")  # applied after loading: not part of the corpus
    key = (*(getattr(cfg, f.name) for f in fields(cfg) if f.name not in split_only), tuple(stats))
    stream = _CACHE.get(key)
    if stream is None:
        stream = _load_stream(cfg, files)
        _CACHE[key] = stream
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)

    n = stream.tokens.numel()
    if n < cfg.val_tokens + min_train_tokens:
        raise ValueError(
            f"data: {stream.name} has {n} tokens, fewer than data.val_tokens ({cfg.val_tokens}) + "
            f"{min_train_tokens} to train on = {cfg.val_tokens + min_train_tokens}; use a larger "
            "corpus or lower data.val_tokens"
        )
    return TokenData(
        train=stream.tokens[: n - cfg.val_tokens],
        val=stream.tokens[n - cfg.val_tokens :],
        vocab_size=stream.tokenizer.vocab_size,
        fingerprint=stream.fingerprint,
        corpus_name=stream.name,
        tokenizer=stream.tokenizer,
    )
