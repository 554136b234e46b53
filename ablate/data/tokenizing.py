"""Documents -> token ids, in this process or in worker processes (at most ``usable_cpus``), in
order: what prepared data is written from. numpy and the tokenizer only (no torch), so that worker
processes start fast.

A chunk of documents becomes one array of ids with the tokenizer's end-of-text id between
documents; the writer puts one more between chunks, so the stream is the same whatever the chunk
size or the number of processes (a test checks it).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice

import numpy as np

from ablate.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

CHUNK_DOCUMENTS = 512
"""Documents per chunk: per task of a worker process, and per progress update."""


def chunks(docs: Iterable[str], size: int = CHUNK_DOCUMENTS) -> Iterator[list[str]]:
    it = iter(docs)
    while chunk := list(islice(it, size)):
        yield chunk


def encode_chunk(tok: Tokenizer, texts: list[str], dtype: np.dtype) -> np.ndarray:
    """One array of ``texts``' ids with ``tok.eos_id`` between them (not after the last)."""
    if isinstance(tok, ByteTokenizer):
        ids: list[np.ndarray] = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    else:
        batch = getattr(tok, "encode_batch", None)
        lists = batch(texts) if batch is not None else [tok.encode(t) for t in texts]
        ids = [np.asarray(x, dtype=np.int64) for x in lists]
    eos = np.array([tok.eos_id], dtype=dtype)
    parts: list[np.ndarray] = []
    for i, a in enumerate(ids):
        if i:
            parts.append(eos)
        parts.append(a.astype(dtype, copy=False))
    return np.concatenate(parts) if parts else np.empty(0, dtype)


# --- worker processes --------------------------------------------------------------------------


def usable_cpus() -> int:
    """The CPUs this process may use: its CPU affinity (what SLURM or ``taskset`` leave it) where
    the system has one, else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(path: str) -> None:
    global _WORKER_TOKENIZER
    # one thread per process: the processes are the parallelism (before the first encode starts
    # the tokenizers library's thread pool)
    os.environ["RAYON_RS_NUM_CPUS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOKENIZER = HFTokenizer(path)


def _encode_in_worker(texts: list[str], dtype: str) -> bytes:
    assert _WORKER_TOKENIZER is not None
    return encode_chunk(_WORKER_TOKENIZER, texts, np.dtype(dtype)).tobytes()


def encode_chunks(
    tok: Tokenizer, docs: Iterable[list[str]], dtype: np.dtype, workers: int
) -> Iterator[tuple[int, np.ndarray]]:
    """``(documents, ids)`` per chunk of ``docs``, in order. With ``workers`` > 1 and a Hugging Face
    tokenizer, chunks are encoded by that many forked processes (one thread each; forked, not
    spawned: a spawned one would import the caller's ``__main__`` and torch), at most two chunks
    each in flight (the reader never runs ahead of them by more); the byte tokenizer is faster here
    than the processes' start-up and their pickling, and always runs in this process."""
    if workers <= 1 or not isinstance(tok, HFTokenizer):
        for chunk in docs:
            yield len(chunk), encode_chunk(tok, chunk, dtype)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tok.path,)) as pool:
        pending: deque[tuple[int, multiprocessing.pool.AsyncResult[bytes]]] = deque()
        for chunk in docs:
            pending.append((len(chunk), pool.apply_async(_encode_in_worker, (chunk, dtype.str))))
            if len(pending) >= 2 * workers:
                n, res = pending.popleft()
                yield n, np.frombuffer(res.get(), dtype)
        while pending:
            n, res = pending.popleft()
            yield n, np.frombuffer(res.get(), dtype)
