"""What prepared data costs and saves, measured in one run (``ablate.data.prepared``).

1. Preparation throughput: a JSONL corpus of English text (the built-in corpus's documents repeated
   to ``--prep-mb``) tokenized into a prepared set by a byte-level BPE tokenizer trained here
   (``--bpe-vocab``, with ``tokenizers``) in 1 and in 2 processes (tokens/s and the ratio), and by
   the byte tokenizer (always one process).
2. A run's data start-up against corpus size: for each of ``--sizes`` (default 10 MB and 1 GB of
   text, byte tokens), a fresh interpreter (imports excluded) times ``load_data`` of the prepared set
   and a read of its first window, and measures how much its resident memory grew; median of
   ``--repeats``. Flat in the corpus size is the goal: the set is memory-mapped, not read. Apart
   from that, the batch sampler's per-epoch permutation of windows (8 bytes per ``seq_len`` 128
   window, so it grows with the corpus: 1/32 of the prepared bytes here).
3. The data loader's share of a training step: ``BatchSampler.next()`` on the mapped set against a
   ``tiny`` optimizer step (fp32, the CPU, batch 8 x 128), both medians in this process.

Run: ``python -m ablate.bench.data [--prep-mb 20] [--sizes 10MB 1GB] [--json]``; the
corpora and sets go to a temporary folder (``--work`` to keep them), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ablate.data import DataConfig, prepare
from ablate.data.corpus import builtin_documents

_CHILD = """
import json, os, sys, time
from ablate.data import DataConfig, load_data
from ablate.data.batches import BatchSampler
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
cfg = DataConfig(corpus='jsonl', path=sys.argv[1], val_tokens=65536)
before = rss(); t0 = time.perf_counter()
data = load_data(cfg, cache=sys.argv[2])
x = data.train[:1025].to(dtype=data.train.dtype, copy=True)  # the first batch's window
seconds, grew = time.perf_counter() - t0, rss() - before
t0 = time.perf_counter()
sampler = BatchSampler(data.train, 128, 8, 0)
x, y = sampler.next()
sampler_s, sampler_grew = time.perf_counter() - t0, rss() - before - grew
print(json.dumps({"seconds": seconds, "rss_bytes": grew, "tokens": data.train.numel(),
                  "sampler_seconds": sampler_s, "sampler_rss_bytes": sampler_grew}))
"""


def _write_corpus(path: Path, target_bytes: int) -> int:
    """JSONL of the built-in documents, repeated (each copy numbered) up to ``target_bytes``."""
    docs = builtin_documents()
    written = copy = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            for d in docs:
                line = json.dumps({"text": f"[{copy}] {d}"}) + "\n"
                f.write(line)
                written += len(line)
                if written >= target_bytes:
                    break
            copy += 1
    return written


def _bpe(path: Path, corpus: Path, vocab: int) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(corpus, encoding="utf-8") as f:
        sample = [json.loads(line)["text"] for _, line in zip(range(2000), f, strict=False)]
    tok.train_from_iterator(sample, trainer)
    tok.save(str(path))
    return path


def _quiet(msg: str) -> None:
    pass


def preparation(work: Path, mb: float, vocab: int) -> list[dict[str, Any]]:
    corpus = work / "prep.jsonl"
    nbytes = _write_corpus(corpus, int(mb * 1e6))
    tok = _bpe(work / "tokenizer.json", corpus, vocab)
    rows: list[dict[str, Any]] = []
    null = open(os.devnull, "w")  # noqa: SIM115  (the progress lines of each build)
    for tokenizer, workers in ((str(tok), 1), (str(tok), 2), ("byte", 1)):
        cfg = DataConfig(corpus="jsonl", path=str(corpus), tokenizer=tokenizer)
        cache = work / f"cache-{tokenizer == 'byte'}-{workers}"
        t0 = time.perf_counter()
        p = prepare(cfg, cache=cache, workers=workers, say=_quiet, progress=null)
        s = time.perf_counter() - t0
        n = p.tokens("train")
        rows.append(
            {
                "tokenizer": "byte" if tokenizer == "byte" else f"bpe{vocab}",
                "processes": workers,
                "text_mb": nbytes / 1e6,
                "tokens": n,
                "seconds": s,
                "tokens_per_s": n / s,
                "mb_per_s": nbytes / 1e6 / s,
            }
        )
        shutil.rmtree(cache)
    null.close()
    bpe1, bpe2 = rows[0]["tokens_per_s"], rows[1]["tokens_per_s"]
    rows[1]["speedup_over_1"] = bpe2 / bpe1
    return rows


def _size(text: str) -> int:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9}
    for u, f in units.items():
        if text.upper().endswith(u):
            return int(float(text[: -len(u)]) * f)
    return int(text)


def start_up(work: Path, sizes: list[str], repeats: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for size in sizes:
        corpus = work / f"startup-{size}.jsonl"
        nbytes = _write_corpus(corpus, _size(size))
        cache = work / "cache-startup"
        t0 = time.perf_counter()
        p = prepare(DataConfig(corpus="jsonl", path=str(corpus), val_tokens=65536), cache=cache)
        prep_s = time.perf_counter() - t0
        corpus_bytes = (p.path / "train.bin").stat().st_size
        runs = []
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(corpus), str(cache)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout))
        rows.append(
            {
                "text": size,
                "text_mb": nbytes / 1e6,
                "tokens": p.tokens("train"),
                "prepared_mb": corpus_bytes / 1e6,
                "prepare_s": prep_s,
                "start_up_ms": statistics.median(r["seconds"] for r in runs) * 1e3,
                "rss_growth_mib": statistics.median(r["rss_bytes"] for r in runs) / 2**20,
                "sampler_ms": statistics.median(r["sampler_seconds"] for r in runs) * 1e3,
                "sampler_rss_mib": statistics.median(r["sampler_rss_bytes"] for r in runs) / 2**20,
            }
        )
        corpus.unlink()
        shutil.rmtree(cache)
    return rows


def loader_share(steps: int = 20) -> dict[str, Any]:
    import torch

    from ablate.data import BatchSampler
    from ablate.model import ModelConfig
    from ablate.train.config import RunConfig, TrainConfig
    from ablate.train.logger import NullLogger
    from ablate.train.loop import build_run
    from ablate.train.state import TrainState

    cfg = RunConfig(
        model=ModelConfig(preset="tiny"),
        data=DataConfig(val_tokens=8192),
        train=TrainConfig(steps=10**6, batch_size=8, seq_len=128, warmup_steps=2, compile=False),
        device="cpu",
    )
    run = build_run(cfg, NullLogger(), None)
    run.model.train()
    state = TrainState()
    for _ in range(3):
        run.optimizer_step(state)
    step_ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run.optimizer_step(state)
        step_ms.append((time.perf_counter() - t0) * 1e3)
    sampler = BatchSampler(run.data.train, 128, 8, 1)
    load_ms = []
    for _ in range(200):
        t0 = time.perf_counter()
        sampler.next()
        load_ms.append((time.perf_counter() - t0) * 1e3)
    step, load = statistics.median(step_ms), statistics.median(load_ms)
    return {
        "step_ms": step,
        "next_batch_ms": load,
        "share": load / step,
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ablate.bench.data", description=__doc__)
    ap.add_argument("--prep-mb", type=float, default=20.0, help="text for the throughput test")
    ap.add_argument("--bpe-vocab", type=int, default=8192)
    ap.add_argument("--sizes", nargs="+", default=["10MB", "1GB"], help="start-up corpora")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="training steps timed for the loader")
    ap.add_argument(
        "--work", default=None, help="folder for the corpora (default: a temporary one)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="ablate-data-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result: dict[str, Any] = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
            "preparation": preparation(work, args.prep_mb, args.bpe_vocab),
            "start_up": start_up(work, args.sizes, args.repeats),
            "loader": loader_share(args.steps),
        }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"machine: {result['machine']}")
    print("\npreparation (tokenize + write + checksum):")
    for r in result["preparation"]:
        extra = f"  {r['speedup_over_1']:.2f}x one process" if "speedup_over_1" in r else ""
        print(
            f"  {r['tokenizer']:>9} {r['processes']} proc  {r['text_mb']:7.1f} MB text  "
            f"{r['tokens']:>12,} tokens  {r['seconds']:6.1f} s  {r['tokens_per_s'] / 1e3:8,.0f}k tok/s"
            f"  {r['mb_per_s']:5.1f} MB/s{extra}"
        )
    print(
        "\na run's data start-up (load_data + a read of its first window, fresh process; median):"
    )
    for r in result["start_up"]:
        print(
            f"  {r['text']:>6} of text  {r['tokens']:>13,} tokens  prepared {r['prepared_mb']:8.1f} MB"
            f" in {r['prepare_s']:6.1f} s  start-up {r['start_up_ms']:6.1f} ms  "
            f"resident +{r['rss_growth_mib']:.1f} MiB; the sampler's permutation of "
            f"{r['tokens'] // 128:,} windows {r['sampler_ms']:.1f} ms, +{r['sampler_rss_mib']:.1f} MiB"
        )
    lo = result["loader"]
    print(
        f"\nloader: next batch {lo['next_batch_ms']:.3f} ms, tiny step {lo['step_ms']:.1f} ms "
        f"({lo['threads']} threads): {100 * lo['share']:.2f}% of a step"
    )


if __name__ == "__main__":
    main()
