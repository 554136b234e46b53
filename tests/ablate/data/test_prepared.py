"""Prepared data (ablate.data.prepared): each data configuration tokenized once into memory-mapped
files with a manifest, a separate validation corpus, and damaged or concurrent preparations. Real
files made in the test: Parquet and JSONL corpora, a BPE tokenizer trained here with `tokenizers`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ablate.data import DataConfig, ValData, data_key, load_data, load_tokenizer, prepare
from ablate.data.manifest import Damaged, check_set
from ablate.data.tokenizer import tokenizer_kind

pytest.importorskip("tokenizers")

DOCS = [
    f"Document {i}: the quick brown fox jumps over the lazy dog, number {i * 7}. " * (5 + i % 4)
    for i in range(60)
]
VAL_DOCS = [f"Held out {i}: a lazy fox, a quick dog and {i} more words. " * 4 for i in range(30)]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def write_parquet(path: Path, docs: list[str]) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": docs}), path)
    return path


def expected_stream(docs: list[str], tokenizer: str) -> list[int]:
    tok = load_tokenizer(tokenizer)
    out: list[int] = []
    for i, d in enumerate(docs):
        if i:
            out.append(tok.eos_id)
        out.extend(tok.encode(d))
    return out


def test_a_bpe_corpus_from_parquet_and_jsonl_prepares_to_the_same_tokens(
    tmp_path: Path, train_bpe: Any
) -> None:
    tok = str(train_bpe(tmp_path / "tokenizer.json", DOCS + VAL_DOCS))
    jsonl = DataConfig(corpus="jsonl", path=str(write_jsonl(tmp_path / "c.jsonl", DOCS)),
                       tokenizer=tok, val_tokens=256)  # fmt: skip
    parquet = DataConfig(corpus="parquet", path=str(write_parquet(tmp_path / "c.parquet", DOCS)),
                         text_field="body", tokenizer=tok, val_tokens=256)  # fmt: skip
    cache = tmp_path / "cache"
    a, b = prepare(jsonl, cache=cache), prepare(parquet, cache=cache)
    assert a.key != b.key and a.built and b.built  # two configurations, two sets
    assert a.fingerprint == b.fingerprint  # the same tokens
    want = expected_stream(DOCS, tok)
    assert a.map("train").to(torch.int64).tolist() == want
    m = a.manifest
    assert m["files"]["train.bin"]["tokens"] == len(want) and m["dtype"] == "uint16"
    assert m["files"]["train.bin"]["documents"] == len(DOCS)
    raw = (a.path / "train.bin").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == m["files"]["train.bin"]["sha256"]
    assert m["tokenizer"].startswith("hf:tokenizer.json@") and m["vocab_size"] == 300
    # found again, not rebuilt; and the run's data is the same ids, memory-mapped
    again = prepare(jsonl, cache=cache)
    assert not again.built and again.key == a.key
    data = load_data(jsonl, cache=cache)
    assert data.prepared == a.key and data.train.dtype == torch.uint16
    assert torch.cat([data.train, data.val]).to(torch.int64).tolist() == want
    assert data.tokenizer.decode(data.val.tolist()[-20:])  # the tokenizer loads on demand


def test_the_key_follows_the_files_and_the_tokenizer_not_the_split(
    tmp_path: Path, train_bpe: Any
) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", DOCS)
    cfg = DataConfig(corpus="jsonl", path=str(path), val_tokens=256)
    key = data_key(cfg)
    assert data_key(DataConfig(corpus="jsonl", path=str(path), val_tokens=512, data_seed=3)) == key
    tok = train_bpe(tmp_path / "tokenizer.json", DOCS + VAL_DOCS)
    assert data_key(DataConfig(corpus="jsonl", path=str(path), tokenizer=str(tok))) != key
    write_jsonl(path, DOCS[:-1])  # the corpus changed: another set, never the old one
    assert data_key(cfg) != key


def test_workers_write_the_same_stream_as_one_process(tmp_path: Path, train_bpe: Any) -> None:
    tok = str(train_bpe(tmp_path / "tokenizer.json", DOCS + VAL_DOCS))
    cfg = DataConfig(corpus="jsonl", path=str(write_jsonl(tmp_path / "c.jsonl", DOCS * 20)),
                     tokenizer=tok, val_tokens=256)  # fmt: skip
    one = prepare(cfg, cache=tmp_path / "one", workers=1)
    two = prepare(cfg, cache=tmp_path / "two", workers=2)
    assert two.manifest["workers"] == 2
    assert one.manifest["files"] == two.manifest["files"]  # counts and sha256
    assert one.fingerprint == two.fingerprint


def test_the_byte_tokenizer_never_starts_workers(tmp_path: Path, monkeypatch) -> None:
    import ablate.data.tokenizing as tokenizing

    def no_processes(*a: object, **k: object) -> None:
        raise AssertionError("the byte tokenizer started worker processes")

    monkeypatch.setattr(tokenizing.multiprocessing, "get_context", no_processes)
    cfg = DataConfig(
        corpus="jsonl", path=str(write_jsonl(tmp_path / "c.jsonl", DOCS)), val_tokens=256
    )
    p = prepare(cfg, cache=tmp_path / "cache", workers=4)
    assert p.manifest["workers"] == 1
    assert p.map("train").tolist() == expected_stream(DOCS, "byte")


def test_a_separate_validation_file_is_the_validation_set(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", DOCS)
    val = write_jsonl(tmp_path / "val.jsonl", VAL_DOCS)
    cfg = DataConfig(corpus="jsonl", path=str(train), val_tokens=1000,
                     val=ValData(corpus="jsonl", path=str(val)))  # fmt: skip
    data = load_data(cfg)
    assert data.train.tolist() == expected_stream(DOCS, "byte")  # all of it trains
    assert data.val.tolist() == expected_stream(VAL_DOCS, "byte")[:1000]
    tail = load_data(DataConfig(corpus="jsonl", path=str(train), val_tokens=1000))
    assert tail.fingerprint != data.fingerprint and tail.prepared != data.prepared
    # from a run's config.json: data.val comes back as a mapping
    assert DataConfig(**json.loads(json.dumps({"corpus": "jsonl", "path": str(train),
                      "val": {"corpus": "jsonl", "path": str(val)}}))).val == cfg.val  # fmt: skip


def test_a_validation_corpus_with_too_few_tokens_names_the_field(tmp_path: Path) -> None:
    cfg = DataConfig(corpus="jsonl", path=str(write_jsonl(tmp_path / "t.jsonl", DOCS)),
                     val_tokens=100_000,
                     val=ValData(corpus="jsonl", path=str(write_jsonl(tmp_path / "v.jsonl", VAL_DOCS))))  # fmt: skip
    with pytest.raises(
        ValueError,
        match=r"data.val: jsonl:.*v.jsonl has \d+ tokens, fewer than data.val_tokens \(100000\)",
    ):
        load_data(cfg)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"data.val: .* has 0 tokens"):
        load_data(DataConfig(corpus="jsonl", path=cfg.path, val_tokens=256,
                             val=ValData(corpus="jsonl", path=str(empty))))  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"corpus": "builtin"}, "data.val.corpus: 'builtin' has no separate validation split"),
        ({"corpus": "jsonl"}, "data.val.path: required for corpus 'jsonl'"),
        ({"corpus": "csv", "path": "x"}, "data.val.corpus: unknown corpus 'csv'"),
        ({"corpus": "hf"}, "data.val.hf_dataset: required for corpus 'hf'"),
    ],
)
def test_a_bad_validation_source_names_its_field(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ValData(**kwargs)  # type: ignore[arg-type]


def test_missing_validation_files_are_named_before_anything_is_read(tmp_path: Path) -> None:
    from ablate.data import check_sources

    cfg = DataConfig(val=ValData(corpus="text", path=str(tmp_path / "nope")))
    with pytest.raises(FileNotFoundError, match="data.val.path: .*nope' does not exist"):
        check_sources(cfg)


def _set_up(tmp_path: Path) -> tuple[DataConfig, Path, list[int]]:
    cfg = DataConfig(
        corpus="jsonl", path=str(write_jsonl(tmp_path / "c.jsonl", DOCS)), val_tokens=256
    )
    p = prepare(cfg, cache=tmp_path / "cache")
    return cfg, p.path, p.map("train").tolist()


def test_an_interrupted_preparation_is_never_trained_on(tmp_path: Path) -> None:
    cfg, path, want = _set_up(tmp_path)
    (path / "manifest.json").unlink()  # as a preparation killed before its last write leaves it
    (path / "train.bin").write_bytes(b"\x01\x00" * 10)
    with pytest.raises(Damaged, match="no manifest"):
        check_set(path, verify=False)
    said: list[str] = []
    p = prepare(cfg, cache=tmp_path / "cache", say=said.append)
    assert p.built and p.map("train").tolist() == want
    assert any("damaged (no manifest" in s and "rebuilding" in s for s in said)


def test_a_truncated_or_corrupted_set_is_rebuilt(tmp_path: Path) -> None:
    cfg, path, want = _set_up(tmp_path)
    raw = (path / "train.bin").read_bytes()
    (path / "train.bin").write_bytes(raw[:-2])  # a short file: any load notices
    data = load_data(cfg, cache=tmp_path / "cache")
    assert torch.cat([data.train, data.val]).tolist() == want
    # one bit flipped, same size: the cheap check a run makes passes, the checksum does not
    flipped = bytearray(raw)
    flipped[100] ^= 1
    (path / "train.bin").write_bytes(bytes(flipped))
    check_set(path, verify=False)
    with pytest.raises(Damaged, match="checksum"):
        check_set(path, verify=True)
    said: list[str] = []
    p = prepare(cfg, cache=tmp_path / "cache", verify=True, say=said.append)
    assert p.built and p.map("train").tolist() == want and "checksum" in said[0]


def _redigest(m: dict) -> dict:
    """``m`` with its digest recomputed (a manifest damaged consistently: only the files can tell)."""
    from ablate.data.manifest import manifest_digest

    m["digest"] = manifest_digest(m)
    return m


def _drop(m: dict, key: str) -> dict:
    del m[key]
    return m


DAMAGES = {
    "a token count its file does not hold": (
        lambda m: _redigest(
            {
                **m,
                "files": {
                    "train.bin": {
                        **m["files"]["train.bin"],
                        "tokens": m["files"]["train.bin"]["tokens"] + 1,
                    }
                },
            }
        ),
        "train.bin has .* bytes, the manifest says",
    ),
    "an unknown dtype": (lambda m: {**m, "dtype": "float8"}, "dtype 'float8' is not one of"),
    "no dtype": (lambda m: _drop(m, "dtype"), "dtype None is not one of"),
    "files as a list": (lambda m: {**m, "files": ["train.bin"]}, "files are not a mapping"),
    "an unknown file": (lambda m: {**m, "files": {**m["files"], "../x": {}}}, "unknown file"),
    "a changed vocab_size": (lambda m: {**m, "vocab_size": 1000}, "changed after .* prepared"),
    "a changed eos_id": (lambda m: {**m, "eos_id": 3}, "changed after .* prepared"),
    "an eos_id outside the vocabulary": (
        lambda m: _redigest({**m, "eos_id": 999}),
        "outside its vocabulary",
    ),
    "a vocabulary its dtype cannot hold": (
        lambda m: _redigest({**m, "vocab_size": 70000}),
        "does not fit its dtype",
    ),
    "another set's key": (lambda m: _redigest({**m, "key": "0" * 16}), "not its folder's name"),
    "nested too deep to read": (lambda m: "[" * 200_000 + "]" * 200_000, "RecursionError"),
    "no digest, no val_corpus": (
        lambda m: _drop(_drop(m, "digest"), "val_corpus"),
        "val_corpus is missing",
    ),
    "a val_corpus without val.bin": (
        lambda m: _redigest({**m, "val_corpus": "text:v.txt"}),
        "val_corpus is missing or does not match",
    ),
    "no tokenizer_file": (lambda m: _redigest(_drop(m, "tokenizer_file")), "tokenizer_file"),
    "no digest, a vocab_size not its tokenizer's": (
        lambda m: {**_drop(m, "digest"), "vocab_size": 300},
        "not its tokenizer's",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_manifest_is_refused_and_the_set_rebuilt(tmp_path: Path, damage: str) -> None:
    """Everything a reader reads is checked; a set whose manifest fails is rebuilt."""
    cfg, path, want = _set_up(tmp_path)
    edit, message = DAMAGES[damage]
    edited = edit(json.loads((path / "manifest.json").read_text()))
    (path / "manifest.json").write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(Damaged, match=message):
        check_set(path, verify=False)
    said: list[str] = []
    p = prepare(cfg, cache=tmp_path / "cache", say=said.append)
    assert p.built and "damaged" in said[0] and p.map("train").tolist() == want
    assert load_data(cfg, cache=tmp_path / "cache").train.numel() == len(want) - 256


def test_a_set_prepared_before_manifest_digests_is_still_used(tmp_path: Path) -> None:
    cfg, path, want = _set_up(tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    del m["digest"]
    (path / "manifest.json").write_text(json.dumps(m))
    p = prepare(cfg, cache=tmp_path / "cache")
    assert not p.built and p.map("train").tolist() == want


def test_an_unreadable_shard_names_token_dtype(tmp_path: Path) -> None:
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"data.token_dtype: .*odd.bin has 3 bytes"):
        prepare(DataConfig(corpus="tokens", path=str(tmp_path / "odd.bin")), cache=tmp_path / "c")
    assert not any((tmp_path / "c").glob("[0-9a-f]*[!k]"))  # no set, no temporary folder left


def _text_corpus(tmp_path: Path, n: int = 30) -> tuple[DataConfig, list[Path]]:
    """A text corpus of ``n`` files (a glob) and a validation file, last in the list."""
    (tmp_path / "corpus").mkdir()
    files = [tmp_path / "corpus" / f"{i:03d}.txt" for i in range(n)] + [tmp_path / "val.txt"]
    for i, f in enumerate(files):
        f.write_text(DOCS[i % len(DOCS)])
    val = ValData(corpus="text", path=str(files[-1]))
    return DataConfig(corpus="text", path=str(tmp_path / "corpus" / "*.txt"), val=val), files


class _ChangeOnFirstWrite:
    """A progress stream that appends to ``path`` when the first part's last line comes: after
    the training files were read, before the validation file is."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines = path, []

    def write(self, line: str) -> None:
        if not self.lines:
            with open(self.path, "a") as f:
                f.write(" and an appended sentence that the read did not see.")
        self.lines.append(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("which", "field", "part"),
    [(3, "data.path", "train"), (-1, "data.val.path", "val")],  # read before; read after
)
def test_a_file_changed_while_it_is_read_is_refused_and_nothing_stored(
    tmp_path: Path, which: int, field: str, part: str
) -> None:
    cfg, files = _text_corpus(tmp_path)
    cache, key = tmp_path / "cache", data_key(cfg)
    with pytest.raises(ValueError, match=rf"{field}: .*{files[which].name} changed while"):
        prepare(cfg, cache=cache, progress=_ChangeOnFirstWrite(files[which]))  # type: ignore[arg-type]
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.lock"]  # no set, no temporary one
    p = prepare(cfg, cache=cache)  # the new content, under its own key
    assert p.built and p.key == data_key(cfg) != key
    sizes = {f[0]: f[1] for f in p.manifest["identity"][part]["files"]}
    assert sizes[str(files[which].resolve())] == files[which].stat().st_size


def test_a_file_changed_after_its_key_was_computed_is_refused(tmp_path: Path) -> None:
    import fcntl

    cfg, files = _text_corpus(tmp_path)
    cache, key = tmp_path / "cache", data_key(cfg)
    cache.mkdir()
    with open(cache / f"{key}.lock", "a+") as lock:  # another preparation holds the key's lock
        fcntl.flock(lock, fcntl.LOCK_EX)

        def meanwhile(msg: str) -> None:  # said while it waits for the lock: the files change,
            assert "waiting" in msg  # then the other preparation lets go
            files[0].write_text("new content entirely")
            fcntl.flock(lock, fcntl.LOCK_UN)

        with pytest.raises(ValueError, match=rf"data.path: .*{files[0].name} changed while"):
            prepare(cfg, cache=cache, say=meanwhile)
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.lock"]
    assert prepare(cfg, cache=cache).key == data_key(cfg) != key


def test_two_processes_preparing_the_same_data_build_it_once(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS * 400)
    code = (
        "import sys; from ablate.data import DataConfig, prepare\n"
        f"p = prepare(DataConfig(corpus='jsonl', path={str(corpus)!r}), cache={str(tmp_path / 'cache')!r})\n"
        "print(p.built, p.key, p.fingerprint)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = sorted(o[0].split() for o in outs)
    assert [r[0] for r in results] == ["False", "True"]  # one built it, the other read it
    assert results[0][1:] == results[1][1:]
    left = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert left == [results[0][1], f"{results[0][1]}.lock"]  # no temporary folder left


def _growth(tmp_path: Path, n_tokens: int) -> int:
    """Resident bytes a fresh process gains by ``load_data`` of an ``n_tokens`` prepared set and a
    read of its first window (imports done before)."""
    path = tmp_path / f"{n_tokens}.bin"
    (np.arange(n_tokens, dtype="<u2") % 257).tofile(path)
    cfg = DataConfig(corpus="tokens", path=str(path))
    prepare(cfg, cache=tmp_path / "cache")
    code = (
        "import os\n"
        "from ablate.data import DataConfig, load_data\n"
        "from ablate.data.prepared import prepare\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        f"cfg = DataConfig(corpus='tokens', path={str(path)!r})\n"
        "before = rss()\n"
        f"d = load_data(cfg, cache={str(tmp_path / 'cache')!r})\n"
        "x = d.train[:1025].to(dtype=d.train.dtype, copy=True)\n"
        "print(rss() - before, d.train.numel())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grew, n = map(int, out.stdout.split())
    assert n == n_tokens - 65536
    return grew


def test_a_runs_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    small, large = _growth(tmp_path, 500_000), _growth(tmp_path, 25_000_000)  # 1 MB and 50 MB
    assert large - small < 4 << 20, f"{small / 2**20:.1f} MiB for 1 MB, {large / 2**20:.1f} for 50"


# --- tokenizers by file, folder and hub name -----------------------------------------------------


def test_a_tokenizer_is_a_file_a_folder_or_a_hub_name(tmp_path: Path, train_bpe: Any) -> None:
    tok = train_bpe(tmp_path / "tokenizer.json", DOCS + VAL_DOCS)
    assert tokenizer_kind(str(tok)) == "file" and tokenizer_kind(str(tmp_path)) == "file"
    assert load_tokenizer(str(tmp_path)).name == load_tokenizer(str(tok)).name
    assert tokenizer_kind("meta-llama/Llama-3.1-8B") == "hub"
    with pytest.raises(
        FileNotFoundError, match="data.tokenizer: 'nope/tokenizer.json' does not exist"
    ):
        tokenizer_kind("nope/tokenizer.json")


def test_an_unreachable_hub_tokenizer_says_how_to_pass_a_file(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from ablate.data import DataConfig, load_data\n"
        "load_data(DataConfig(tokenizer='ablate-tests/no-such-model'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    # said at once, without the hub client's retries: offline, so not fetched
    assert (
        "data.tokenizer: 'ablate-tests/no-such-model' is not in the Hugging Face cache and the "
        "hub cannot be reached (HF_HUB_OFFLINE is set)" in out.stderr
    )
    assert "give its path: data.tokenizer: /path/to/tokenizer.json" in out.stderr


def test_a_uint32_set_for_a_vocabulary_past_65536(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {
        "<|endoftext|>": 0,
        "[UNK]": 1,
        "fox": 70_000,
        **{f"w{i}": i + 2 for i in range(70_000 - 2)},
    }
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    docs = ["fox w5 fox " * 400] * 4
    cfg = DataConfig(corpus="jsonl", path=str(write_jsonl(tmp_path / "c.jsonl", docs)),
                     tokenizer=str(tmp_path / "tokenizer.json"), val_tokens=100)  # fmt: skip
    data = load_data(cfg, cache=tmp_path / "cache", min_train_tokens=100)
    assert data.train.dtype == torch.uint32 and data.vocab_size == 70_001
    assert int(data.train.to(torch.int64).max()) == 70_000
    assert np.array_equal(data.val.to(torch.int64).numpy()[-3:], [70_000, 7, 70_000])
