"""Prepared data: each distinct data configuration tokenized once into memory-mappable token files
in a cache folder keyed by its fingerprint; and ``load_data``, which maps them for a run.

A prepared set is a folder ``<cache>/<key>/`` holding ``train.bin`` (and ``val.bin`` with
``data.val``): token ids, little-endian uint16 (vocabularies up to 65536) or uint32, documents
separated by the tokenizer's end-of-text id; and ``manifest.json``: the identity it was keyed by,
each file's token count, dtype, size and sha256, the tokenizer and the stream's fingerprint.

- keyed: ``data_identity`` holds what decides the tokens: the corpus fields, the local files'
  names, sizes and modification times, the tokenizer's identity (a file's content hash, a hub name)
  and the validation corpus; not ``val_tokens`` nor ``data_seed``, which only split and order them.
  A file that changes between the key's computation and the end of its read is refused, naming it.
  The cache is ``$ABLATE_DATA_CACHE``, else ``~/.cache/ablate/data`` (a study's ``data_cache``).
- atomic: a set is written into a temporary folder, its manifest last, and renamed into place,
  under a lock file (``fcntl.flock``): two drivers or ranks preparing the same data build it once;
  the second waits, then reads it.
- checked (``manifest.py``): every ``load_data`` checks the manifest and each file's size
  (cheap: a run's start-up does not grow with the corpus); ``prepare(verify=True)`` (``ablate
  run`` and ``ablate data prepare``, once per study) checks the checksums too. A set that fails
  either is removed and rebuilt, never trained on.
- parallel: a Hugging Face tokenizer encodes in ``workers`` processes (``tokenizing.py``); the byte
  tokenizer never starts any.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ablate.data.config import DataConfig, ValData
from ablate.data.manifest import DTYPES, FORMAT, MANIFEST, Damaged, check_set, manifest_digest
from ablate.data.sources import (
    changed_states,
    check_unchanged,
    corpus_name,
    documents,
    file_states,
    keyed_states,
    left_out_names,
    source_files,
    source_identity,
)
from ablate.data.tokenizer import HFTokenizer, Tokenizer, load_tokenizer, tokenizer_identity
from ablate.data.tokenizing import chunks, encode_chunks, usable_cpus

if TYPE_CHECKING:
    import torch

CACHE_ENV = "ABLATE_DATA_CACHE"
MIN_TRAIN_TOKENS = 4096
"""The fewest training tokens a run accepts (after the held-out tail)."""


def default_workers() -> int:
    """Processes that tokenize with a Hugging Face tokenizer by default: half the CPUs this process
    may use (each single-threaded; one process already encodes on several threads), 1 to 8."""
    return max(1, min(8, usable_cpus() // 2))


def default_cache() -> Path:
    """``$ABLATE_DATA_CACHE``, else ``$XDG_CACHE_HOME/ablate/data`` (``~/.cache/ablate/data``)."""
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ablate" / "data"


def data_identity(cfg: DataConfig) -> dict[str, Any]:
    """What decides a data configuration's tokens (see the module docstring); without the network."""
    return {
        "format": FORMAT,
        "train": source_identity(cfg, "data."),
        "val": source_identity(cfg.val, "data.val.") if cfg.val is not None else None,
        "tokenizer": tokenizer_identity(cfg.tokenizer),
    }


def data_key(cfg: DataConfig, identity: dict[str, Any] | None = None) -> str:
    """The prepared set's name: 16 hex digits of the sha256 of ``data_identity`` (``identity``)."""
    blob = json.dumps(identity or data_identity(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Prepared:
    """A prepared set on disk and its manifest."""

    key: str
    path: Path
    manifest: dict[str, Any] = field(repr=False)
    built: bool = False
    """Built by this call (not found in the cache)."""

    def tokens(self, part: str) -> int:
        """Token count of ``train`` or ``val`` (0 when the set has no such part)."""
        f = self.manifest["files"].get(f"{part}.bin")
        return int(f["tokens"]) if f else 0

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    def map(self, part: str) -> torch.Tensor:
        """The part's ids, memory-mapped copy-on-write (pages are read when a batch touches them)."""
        import torch  # here: a study is checked against its prepared sets without torch

        dtypes = {"uint16": torch.uint16, "uint32": torch.uint32}  # DTYPES, as torch names them
        n, dtype = self.tokens(part), dtypes[self.manifest["dtype"]]
        if n == 0:
            return torch.empty(0, dtype=dtype)
        return torch.from_file(str(self.path / f"{part}.bin"), shared=False, size=n, dtype=dtype)


@contextlib.contextmanager
def _locked(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"data: waiting for another process preparing {path.stem}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare(
    cfg: DataConfig,
    *,
    cache: str | Path | None = None,
    workers: int | None = None,
    verify: bool = False,
    say: Callable[[str], None] = _stderr,
    progress: IO[str] | None = None,
) -> Prepared:
    """The prepared set of ``cfg`` in ``cache`` (default ``default_cache()``): reused when it is
    whole (``verify``: checksums too), else built (``workers`` processes for a Hugging Face
    tokenizer, default ``default_workers()``). ``say`` gets one line per event; ``progress`` (default
    stderr) the progress of a build. Raises ValueError/FileNotFoundError naming the field."""
    root = Path(cache) if cache is not None else default_cache()
    identity = data_identity(cfg)
    key = data_key(cfg, identity)
    final = root / key
    if final.is_dir():
        with contextlib.suppress(Damaged):
            return Prepared(key, final, check_set(final, verify=verify))
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock", say):
        if final.is_dir():
            try:
                return Prepared(key, final, check_set(final, verify=verify))
            except Damaged as e:
                say(f"data: the prepared set {final} is damaged ({e}); rebuilding it")
                aside = root / f".damaged-{key}-{os.getpid()}"
                os.rename(final, aside)
                shutil.rmtree(aside, ignore_errors=True)
        for line in left_out_names(cfg):  # said when the set is built: once
            say(line)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            manifest = _build(cfg, identity, key, tmp, workers, progress or sys.stderr)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    say(
        f"data: prepared {key} ({manifest['corpus']}, {manifest['tokenizer']}): "
        f"{_count(manifest)} in {manifest['seconds']:.1f} s"
    )
    return Prepared(key, final, manifest, built=True)


def already_prepared(cfg: DataConfig, cache: str | Path | None = None) -> Prepared | None:
    """``cfg``'s prepared set if it is there and whole (sizes checked, not checksums), else None."""
    return prepared_set(data_key(cfg), cache)


def prepared_set(key: str, cache: str | Path | None = None) -> Prepared | None:
    """The prepared set named ``key`` (a run's ``data.prepared``) if it is there and whole (sizes
    checked, not checksums), else None."""
    root = Path(cache) if cache is not None else default_cache()
    if not re.fullmatch(r"[0-9a-f]{16}", key):  # no key: nothing outside the cache is read
        return None
    try:
        return Prepared(key, root / key, check_set(root / key, verify=False))
    except Damaged:
        return None


def identity_changes(cfg: DataConfig, identity: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What of ``cfg``'s data is no longer as ``identity`` (a prepared set's, from its manifest)
    saw it, from what a key holds, without reading a corpus file: ``(part, what)`` for each file
    that appeared, went away or changed its size or modification time (part ``data.`` or
    ``data.val.``), and for a tokenizer file that changed (``data.tokenizer``)."""
    out = []
    if identity.get("tokenizer") != tokenizer_identity(cfg.tokenizer):
        out.append(("data.tokenizer", f"{cfg.tokenizer} changed"))
    now = {k: v[:2] for k, v in file_states(cfg).items()}
    for named, f, what in changed_states(keyed_states(identity["train"], identity["val"]), now):
        out.append(("data.val." if named.startswith("data.val.") else "data.", f"{f} {what}"))
    return out


def _count(manifest: dict[str, Any]) -> str:
    parts = [f"{f['tokens']:,} {name[:-4]} tokens" for name, f in manifest["files"].items()]
    return ", ".join(parts)


# --- building a set -----------------------------------------------------------------------------


class _Progress:
    """Documents and tokens so far: a line redrawn at most every 0.5 s on a terminal, a new line at
    most every 30 s otherwise."""

    def __init__(self, what: str, total: int | None, out: IO[str]) -> None:
        self.what, self.total, self.out = what, total, out
        self.tty = out.isatty()
        self.t0 = self.last = time.perf_counter()
        self.docs = self.tokens = 0

    def add(self, docs: int, tokens: int, *, final: bool = False) -> None:
        self.docs += docs
        self.tokens += tokens
        now = time.perf_counter()
        if not final and now - self.last < (0.5 if self.tty else 30.0):
            return
        self.last = now
        rate = self.tokens / max(now - self.t0, 1e-9)
        done = ""
        if self.total:
            frac = min(self.docs / self.total, 1.0)
            done = f"[{'#' * int(20 * frac):<20}] {100 * frac:3.0f}% "
        line = (
            f"data: tokenizing {self.what}: {done}{self.docs:,} documents, "
            f"{self.tokens:,} tokens, {rate / 1e3:,.0f}k tokens/s"
        )
        if self.tty:
            self.out.write("\r" + line + ("\n" if final else ""))
        elif final or now - self.t0 >= 30.0:
            self.out.write(line + "\n")
        self.out.flush()


def _token_arrays(
    src: DataConfig | ValData, field: str, tok: Tokenizer, dtype: np.dtype, workers: int
) -> Iterator[tuple[int, np.ndarray]]:
    """``(documents, ids)`` per chunk; the ids of consecutive chunks still need an EOS between."""
    files = source_files(src, field)
    if src.corpus != "tokens":
        yield from encode_chunks(tok, chunks(documents(src, files, field)), dtype, workers)
        return
    stored = DTYPES[src.token_dtype]
    if stored.itemsize == 2 and tok.vocab_size > 1 << 16:
        raise ValueError(
            f"{field}token_dtype: 'uint16' cannot hold the {tok.vocab_size} ids of data.tokenizer "
            f"({tok.name}); use 'uint32'"
        )
    step = 1 << 24
    for f in files:
        nbytes = f.stat().st_size
        if nbytes % stored.itemsize:
            raise ValueError(
                f"{field}token_dtype: {f} has {nbytes} bytes, not a whole number of "
                f"{src.token_dtype} tokens"
            )
        n = nbytes // stored.itemsize
        for start in range(0, n, step):
            a = np.fromfile(
                f, dtype=stored, count=min(step, n - start), offset=start * stored.itemsize
            )
            # shards are one stream: no EOS between their pieces
            yield (1 if start == 0 else 0), a


def _write_part(
    src: DataConfig | ValData,
    field: str,
    tok: Tokenizer,
    dtype: np.dtype,
    out: Path,
    workers: int,
    fingerprint: Any,
    progress: IO[str],
) -> dict[str, Any]:
    sha = hashlib.sha256()
    eos = np.array([tok.eos_id], dtype=dtype)
    tokens = docs = 0
    max_id = -1
    shown = _Progress(corpus_name(src), src.max_documents, progress)
    with open(out, "wb") as f:
        for n_docs, ids in _token_arrays(src, field, tok, dtype, workers):
            parts = [ids] if src.corpus == "tokens" or not docs or not n_docs else [eos, ids]
            for a in parts:
                if not a.size:
                    continue
                a = a.astype(dtype, copy=False)
                raw = a.tobytes()
                f.write(raw)
                sha.update(raw)
                fingerprint.update(a.astype("<i8").tobytes())
                max_id = max(max_id, int(a.max()))
                tokens += a.size
            docs += n_docs
            shown.add(n_docs, ids.size + (len(parts) - 1))
        f.flush()
        os.fsync(f.fileno())
    shown.add(0, 0, final=True)
    if max_id >= tok.vocab_size:
        raise ValueError(
            f"data.tokenizer: token id {max_id} in {corpus_name(src)} is outside the vocabulary "
            f"({tok.vocab_size}) of {tok.name}; wrong tokenizer or {field}token_dtype?"
        )
    return {
        "tokens": tokens,
        "bytes": tokens * dtype.itemsize,
        "sha256": sha.hexdigest(),
        "documents": docs if src.corpus != "tokens" else None,
        "corpus": corpus_name(src),
    }


def _build(
    cfg: DataConfig,
    identity: dict[str, Any],
    key: str,
    tmp: Path,
    workers: int | None,
    progress: IO[str],
) -> dict[str, Any]:
    """Writes the set of ``cfg`` keyed by ``identity`` into ``tmp``; refuses (ValueError, naming
    the file) when a file is not as ``identity`` saw it, or changes while it is read."""
    t0 = time.perf_counter()
    states = file_states(cfg)  # as the key saw them, and unchanged until all is read
    check_unchanged(
        keyed_states(identity["train"], identity["val"]), {k: v[:2] for k, v in states.items()}
    )
    tok = load_tokenizer(cfg.tokenizer)
    dtype_name = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    dtype = DTYPES[dtype_name]
    n_workers = workers if workers is not None else default_workers()
    # the fingerprint runs logged before prepared data existed: the tokenizer's name, then the
    # stream as int64 (the held-out tail included), so the same tokens keep their fingerprint
    fp = hashlib.sha256(tok.name.encode() + b"\0")
    files = {
        "train.bin": _write_part(
            cfg, "data.", tok, dtype, tmp / "train.bin", n_workers, fp, progress
        )
    }
    if cfg.val is not None:
        fp.update(b"\0val\0")
        files["val.bin"] = _write_part(
            cfg.val, "data.val.", tok, dtype, tmp / "val.bin", n_workers, fp, progress
        )
    check_unchanged(states, file_states(cfg))
    manifest = {
        "format": FORMAT,
        "key": key,
        "identity": identity,
        "corpus": corpus_name(cfg),
        "val_corpus": corpus_name(cfg.val) if cfg.val is not None else None,
        "tokenizer": tok.name,
        "tokenizer_file": tok.path if isinstance(tok, HFTokenizer) else None,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype_name,
        "files": files,
        "fingerprint": fp.hexdigest()[:16],
        "workers": n_workers if isinstance(tok, HFTokenizer) else 1,
        "seconds": time.perf_counter() - t0,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest["digest"] = manifest_digest(manifest)
    with open(tmp / MANIFEST, "w") as f:  # last: a set with a manifest is whole
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return manifest


# --- a run's data ---------------------------------------------------------------------------------


@dataclass
class TokenData:
    """A run's training tokens and its fixed validation set, memory-mapped from a prepared set."""

    train: torch.Tensor = field(repr=False)
    """1-D token ids (uint16 or uint32), memory-mapped."""
    val: torch.Tensor = field(repr=False)
    """The validation set: the stream's last ``val_tokens`` ids, or ``data.val``'s first."""
    vocab_size: int
    fingerprint: str
    corpus_name: str
    prepared: str
    """The prepared set's key (its folder's name in the cache), recorded as ``data.prepared``."""
    tokenizer_spec: str = "byte"
    """What loads the tokenizer (``byte`` or its local file): ``tokenizer`` on first use."""

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the tokens were made with (loaded on first use: a run needs only ids)."""
        return load_tokenizer(self.tokenizer_spec)


def check_counts(cfg: DataConfig, p: Prepared, min_train_tokens: int = MIN_TRAIN_TOKENS) -> None:
    """Raises ValueError, naming the fields, when the set holds too few tokens for ``cfg``."""
    n, name = p.tokens("train"), p.manifest["corpus"]
    if cfg.val is None:
        if n < cfg.val_tokens + min_train_tokens:
            raise ValueError(
                f"data: {name} has {n} tokens, fewer than data.val_tokens ({cfg.val_tokens}) + "
                f"{min_train_tokens} to train on = {cfg.val_tokens + min_train_tokens}; use a "
                "larger corpus or lower data.val_tokens"
            )
        return
    if n < min_train_tokens:
        raise ValueError(
            f"data: {name} has {n} tokens, fewer than the {min_train_tokens} a run trains on at least"
        )
    if (v := p.tokens("val")) < cfg.val_tokens:
        raise ValueError(
            f"data.val: {p.manifest['val_corpus']} has {v} tokens, fewer than data.val_tokens "
            f"({cfg.val_tokens}); lower data.val_tokens or give data.val more documents"
        )


def load_data(
    cfg: DataConfig, *, min_train_tokens: int = MIN_TRAIN_TOKENS, cache: str | Path | None = None
) -> TokenData:
    """``cfg``'s prepared set (prepared now if no process has yet), memory-mapped and split: without
    ``data.val`` the last ``cfg.val_tokens`` tokens are validation and the rest training; with it,
    the whole stream trains and ``data.val``'s first ``val_tokens`` validate. Raises when fewer
    than ``min_train_tokens`` are left to train on. The tensors are read-only by contract."""
    p = prepare(cfg, cache=cache)
    check_counts(cfg, p, min_train_tokens)
    stream = p.map("train")
    if cfg.val is None:
        n = stream.numel()
        train, val = stream[: n - cfg.val_tokens], stream[n - cfg.val_tokens :]
    else:
        train, val = stream, p.map("val")[: cfg.val_tokens]
    return TokenData(
        train=train,
        val=val,
        vocab_size=p.vocab_size,
        fingerprint=p.fingerprint,
        corpus_name=p.manifest["corpus"],
        prepared=p.key,
        tokenizer_spec=p.manifest["tokenizer_file"] or "byte",
    )
