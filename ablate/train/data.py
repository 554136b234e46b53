"""Training data's configuration and its sources: ``DataConfig`` (with ``data.val``, a validation
corpus of its own), and the readers that turn a corpus into documents.

- corpora: the built-in one (``corpus.py``: Python's own documentation, no download; the default),
  local text / JSONL / Parquet files, Hugging Face datasets, and pre-tokenized binary shards;
- tokenizers (``tokenizer.py``): UTF-8 bytes (vocab 257 with EOS) or a Hugging Face tokenizer (a
  ``tokenizer.json``, a folder holding one, or a hub name);
- the split: without ``data.val`` the *last* ``val_tokens`` tokens of the stream are the fixed
  validation set, never trained on; with it, the first ``val_tokens`` of that corpus.

Tokenizing, the cache of prepared (memory-mapped) token files and ``load_data`` live in
``prepared.py`` (``load_data`` and ``TokenData`` are re-exported from there by ``ablate.train``);
batches in ``batches.py``. Optional packages (``pyarrow``, ``datasets``, ``tokenizers``,
``huggingface_hub``) are imported only by the code that reads those formats.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from glob import glob
from itertools import islice
from pathlib import Path
from typing import Literal, get_args

from .batches import BatchSampler, val_batches  # noqa: F401  (re-exported)
from .corpus import builtin_documents
from .tokenizer import _import_optional, tokenizer_kind

Corpus = Literal["builtin", "text", "jsonl", "parquet", "hf", "tokens"]
TokenDtype = Literal["uint16", "uint32"]

# Corpora read from data.path, and the file extension a directory is searched for.
_FILE_EXT = {"text": ".txt", "jsonl": ".jsonl", "parquet": ".parquet", "tokens": ".bin"}


SEED_LIMIT = 2**32
"""Seeds (model and data order) are below this: every random stream they key accepts them."""


def _check_source(src: DataConfig | ValData, field: str) -> None:
    """The checks a corpus's fields share, in the training data (``data.``) and in ``data.val.``."""
    corpora = get_args(Corpus)
    if src.corpus not in corpora:
        raise ValueError(f"{field}corpus: unknown corpus {src.corpus!r}; expected one of {corpora}")
    if src.corpus in _FILE_EXT and not src.path:
        raise ValueError(
            f"{field}path: required for corpus {src.corpus!r} "
            f"(a file, a directory of {_FILE_EXT[src.corpus]} files, or a glob)"
        )
    if src.corpus not in _FILE_EXT and src.path is not None:
        hint = f"; name the dataset in {field}hf_dataset" if src.corpus == "hf" else ""
        raise ValueError(f"{field}path: not used by corpus {src.corpus!r}{hint}")
    if src.corpus == "hf" and not src.hf_dataset:
        raise ValueError(f"{field}hf_dataset: required for corpus 'hf' (e.g. 'allenai/c4')")
    if src.corpus != "hf" and (src.hf_dataset is not None or src.hf_config is not None):
        raise ValueError(
            f"{field}hf_dataset/hf_config: only used by corpus 'hf', not {src.corpus!r}"
        )
    if not src.text_field:
        raise ValueError(f"{field}text_field: must name a field, got an empty string")
    if src.max_documents is not None:
        if src.corpus == "tokens":
            raise ValueError(
                f"{field}max_documents: shards of tokens have no documents; leave it unset"
            )
        if not _is_int(src.max_documents) or src.max_documents < 1:
            raise ValueError(
                f"{field}max_documents: must be None or >= 1, got {src.max_documents!r}"
            )
    if src.token_dtype not in get_args(TokenDtype):
        raise ValueError(
            f"{field}token_dtype: {src.token_dtype!r}; expected one of {get_args(TokenDtype)}"
        )


@dataclass(kw_only=True, slots=True)
class ValData:
    """``data.val``: a validation corpus of its own (e.g. C4's ``validation`` split), tokenized by
    the training data's tokenizer; its first ``data.val_tokens`` tokens are the validation set."""

    corpus: Corpus
    """As ``data.corpus``: text, jsonl, parquet, hf, tokens (builtin: no separate split exists)."""
    path: str | None = None
    text_field: str = "text"
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "validation"
    """For corpus ``hf``: the split to read (default ``validation``)."""
    max_documents: int | None = None
    token_dtype: TokenDtype = "uint16"

    def __post_init__(self) -> None:
        if self.corpus == "builtin":
            raise ValueError(
                "data.val.corpus: 'builtin' has no separate validation split; leave data.val unset "
                "to validate on the held-out tail of the training stream"
            )
        _check_source(self, "data.val.")


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
    """``byte`` (UTF-8 bytes + EOS, vocab 257), the path of a Hugging Face ``tokenizer.json`` (or of
    a folder holding one), or a hub name such as ``meta-llama/Llama-3.1-8B`` (fetched once; gated
    models need ``HF_TOKEN``)."""
    token_dtype: TokenDtype = "uint16"
    """Element type of the ``tokens`` shards; ``uint16`` holds vocabularies up to 65536."""
    val_tokens: int = 65536
    """Size of the fixed validation set: the last ``val_tokens`` of the token stream, never trained
    on, or with ``val`` the first ``val_tokens`` of that corpus."""
    val: ValData | None = None
    """A validation corpus of its own (``{corpus: hf, hf_dataset: allenai/c4, hf_config: en,
    hf_split: validation}``); then the whole training stream is trained on. None: the tail."""
    data_seed: int = 0
    """Seed of the order of training batches; separate from the model initialization seed."""

    def __post_init__(self) -> None:
        if isinstance(self.val, dict):  # from a run's config.json or a task's dict
            self.val = ValData(**self.val)
        _check_source(self, "data.")
        if not self.tokenizer:
            raise ValueError(
                "data.tokenizer: 'byte', the path of a tokenizer.json or a hub name, got ''"
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


def resolve_files(src: DataConfig | ValData, field: str = "data.") -> list[Path]:
    """The files a file corpus reads, in name order; raises naming ``{field}path``."""
    spec, ext = str(src.path), _FILE_EXT[src.corpus]
    if any(c in spec for c in "*?["):
        files = [Path(p) for p in glob(spec, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(spec):
        files = [p for p in Path(spec).iterdir() if p.is_file() and p.name.endswith(ext)]
    elif os.path.isfile(spec):
        files = [Path(spec)]
    else:
        raise FileNotFoundError(f"{field}path: {spec!r} does not exist")
    if not files:
        raise FileNotFoundError(
            f"{field}path: no files match {spec!r} (a directory is searched for *{ext})"
        )
    return sorted(files, key=str)


def check_sources(cfg: DataConfig) -> None:
    """Fail fast on inputs that do not exist (data files, the validation corpus's files, a
    tokenizer file), before any training starts, without the network (a hub tokenizer is fetched
    when the data is prepared); relative paths are taken from the current directory."""
    if cfg.corpus in _FILE_EXT:
        resolve_files(cfg)
    if cfg.val is not None and cfg.val.corpus in _FILE_EXT:
        resolve_files(cfg.val, "data.val.")
    tokenizer_kind(cfg.tokenizer)


def source_files(src: DataConfig | ValData, field: str = "data.") -> list[Path]:
    """The local files a corpus reads (a local ``save_to_disk`` dataset's files too): their names,
    sizes and modification times are part of the prepared data's fingerprint."""
    if src.corpus in _FILE_EXT:
        return resolve_files(src, field)
    if src.corpus == "hf" and os.path.isdir(str(src.hf_dataset)):
        return sorted(p for p in Path(str(src.hf_dataset)).rglob("*") if p.is_file())
    return []


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


def _hf_documents(cfg: DataConfig | ValData) -> Iterator[str]:
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


def documents(cfg: DataConfig | ValData, files: list[Path]) -> Iterator[str]:
    """The corpus's non-empty documents in order, at most ``max_documents`` (not ``tokens``)."""
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


def corpus_name(src: DataConfig | ValData) -> str:
    """A readable name of a corpus, for logs and manifests (``hf:allenai/c4/en:validation``)."""
    if src.corpus == "builtin":
        name = f"builtin-py{sys.version_info[0]}.{sys.version_info[1]}"
    elif src.corpus == "hf":
        config = f"/{src.hf_config}" if src.hf_config else ""
        name = f"hf:{src.hf_dataset}{config}:{src.hf_split}"
    else:
        name = f"{src.corpus}:{src.path}"
    return name if src.max_documents is None else f"{name}[:{src.max_documents}]"
