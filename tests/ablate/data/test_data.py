"""Tests for ablate.data.config: corpora, tokenizers, the held-out split and the batch sampler."""

import array
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.data import (
    BatchSampler,
    DataConfig,
    TokenData,
    ValData,
    load_data,
    load_tokenizer,
    val_batches,
)
from ablate.data.corpus import builtin_documents
from ablate.data.tokenizer import ByteTokenizer

HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
HAS_DATASETS = importlib.util.find_spec("datasets") is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None

DOCS_A = [
    f"Document {i} of corpus A: the quick brown fox jumps over the lazy dog. " * 20
    for i in range(12)
]
DOCS_B = [
    f"Document {i} of corpus B: a different text, with ünïcödé — and more. " * 20 for i in range(12)
]


def small(**kw: object) -> DataConfig:
    return DataConfig(val_tokens=256, **kw)  # type: ignore[arg-type]


def write_text(dir: Path, docs: list[str]) -> Path:
    dir.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (dir / f"{i:03d}.txt").write_text(d, encoding="utf-8")
    return dir


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    return path


def write_shard(path: Path, ids: list[int], token_dtype: str) -> None:
    """Raw little-endian ids, as nanoGPT's ``prepare.py`` writes them with numpy."""
    buf = array.array({"uint16": "H", "uint32": "I"}[token_dtype], ids)
    assert buf.itemsize == {"uint16": 2, "uint32": 4}[token_dtype] and sys.byteorder == "little"
    path.write_bytes(buf.tobytes())


def stream(data: TokenData) -> torch.Tensor:
    """The whole token stream: train followed by val."""
    return torch.cat([data.train, data.val]).to(torch.int64)


# --- built-in corpus ---------------------------------------------------------------------------


def test_builtin_corpus_is_deterministic_large_and_english(tmp_path: Path) -> None:
    first = load_data(DataConfig(), cache=tmp_path / "one")  # prepared twice, from scratch
    second = load_data(DataConfig(), cache=tmp_path / "two")
    assert first.fingerprint == second.fingerprint
    assert torch.equal(first.train, second.train) and torch.equal(first.val, second.val)
    assert first.corpus_name == f"builtin-py{sys.version_info[0]}.{sys.version_info[1]}"
    assert first.vocab_size == 257

    n_tokens = first.train.numel() + first.val.numel()
    assert n_tokens > 1_500_000  # about 2.1 MB of text on Python 3.11
    text = "\n".join(builtin_documents())
    words = re.findall(r"[a-z]+", text.lower())
    assert len(words) > 200_000
    assert words.count("the") / len(words) > 0.03  # English prose: "the" is ~5% of words
    assert sum(c.isascii() for c in text) / len(text) > 0.99


def test_builtin_corpus_is_identical_in_a_fresh_process(tmp_path: Path) -> None:
    """A new interpreter with an empty corpus cache builds the same token stream."""
    code = (
        "from ablate.data import DataConfig, load_data; print(load_data(DataConfig()).fingerprint)"
    )
    env = {**os.environ, "ABLATE_CACHE_DIR": str(tmp_path), "ABLATE_DATA_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert list(tmp_path.glob("builtin-corpus-*.json"))
    assert out.stdout.strip() == load_data(DataConfig()).fingerprint


def test_an_empty_cache_dir_keeps_the_corpus_in_the_default_not_here(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    env = {**os.environ, "ABLATE_CACHE_DIR": "", "HOME": str(tmp_path / "home")}
    code = "from ablate.data.corpus import builtin_documents; builtin_documents()"
    subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "work", env=env, check=True, timeout=300
    )
    assert list((tmp_path / "home" / ".cache" / "ablate").glob("builtin-corpus-*.json"))
    assert not list((tmp_path / "work").iterdir())  # nothing written in the current folder


def test_builtin_corpus_ignores_what_other_libraries_patch() -> None:
    # Ray and MLflow replace logging's record factory; other libraries patch stdlib functions. The
    # corpus is read from source files, so a worker that imported them sees the same data.
    import inspect
    import logging

    from ablate.data.corpus import builtin_documents

    before = builtin_documents()
    factory, isgen = logging.getLogRecordFactory(), inspect.isgenerator
    try:
        logging.setLogRecordFactory(lambda *a, **k: factory(*a, **k))
        inspect.isgenerator = lambda obj: False  # type: ignore[assignment]
        assert builtin_documents() == before
    finally:
        logging.setLogRecordFactory(factory)
        inspect.isgenerator = isgen


def test_builtin_validation_tail_mixes_documentation_and_docstrings() -> None:
    data = load_data(DataConfig())
    val_text = data.tokenizer.decode(data.val.tolist())
    assert len(val_text) > 60_000 and val_text.count(" the ") > 300


# --- tokenizers --------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_unicode() -> None:
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 257 and tok.eos_id == 256
    text = "naïve café — 東京 🚀 \x00 end"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode([*tok.encode("a"), tok.eos_id, *tok.encode("b")]) == "ab"  # EOS is not text


@pytest.mark.skipif(not HAS_TOKENIZERS, reason="the optional 'tokenizers' package is not installed")
def test_hf_tokenizer_file_encodes_documents(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, "the": 2, "quick": 3, "fox": 4}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tok = load_tokenizer(str(path))
    assert tok.vocab_size == 5 and tok.eos_id == 0
    assert tok.encode("the quick fox") == [2, 3, 4]


def test_missing_tokenizer_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data.tokenizer: .*nope.json' does not exist"):
        load_data(small(tokenizer=str(tmp_path / "nope.json")))


# --- local files -------------------------------------------------------------------------------


def test_text_and_jsonl_files_load_and_fingerprint_their_tokens(tmp_path: Path) -> None:
    text_a = load_data(small(corpus="text", path=str(write_text(tmp_path / "a", DOCS_A))))
    text_b = load_data(small(corpus="text", path=str(write_text(tmp_path / "b", DOCS_B))))
    jsonl_a = load_data(small(corpus="jsonl", path=str(write_jsonl(tmp_path / "a.jsonl", DOCS_A))))
    assert text_a.fingerprint != text_b.fingerprint
    # The fingerprint is of the tokens, not the file format: the same documents match.
    assert jsonl_a.fingerprint == text_a.fingerprint
    eos = text_a.tokenizer.eos_id
    ids: list[int] = []  # documents in name order, EOS between them
    for i, d in enumerate(DOCS_A):
        ids += ([eos] if i else []) + list(d.encode())
    assert stream(text_a).tolist() == ids
    assert text_a.corpus_name.startswith("text:") and jsonl_a.corpus_name.startswith("jsonl:")


@pytest.mark.skipif(not HAS_PYARROW, reason="the optional 'pyarrow' package is not installed")
def test_parquet_files_load_like_the_same_documents_as_text(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": DOCS_A[:6]}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"body": DOCS_A[6:]}), tmp_path / "1.parquet")
    parquet = load_data(small(corpus="parquet", path=str(tmp_path), text_field="body"))
    text = load_data(small(corpus="text", path=str(write_text(tmp_path / "txt", DOCS_A))))
    assert parquet.fingerprint == text.fingerprint
    with pytest.raises(ValueError, match="data.text_field"):
        load_data(small(corpus="parquet", path=str(tmp_path), text_field="text"))


def test_glob_and_max_documents_select_files_in_name_order(tmp_path: Path) -> None:
    write_text(tmp_path, DOCS_A)
    (tmp_path / "notes.md").write_text("not a .txt file")
    by_dir = load_data(small(corpus="text", path=str(tmp_path)))
    by_glob = load_data(small(corpus="text", path=str(tmp_path / "*.txt")))
    assert by_dir.fingerprint == by_glob.fingerprint
    limited = load_data(
        DataConfig(corpus="text", path=str(tmp_path), max_documents=8, val_tokens=64)
    )
    assert stream(limited).numel() == sum(len(d) for d in DOCS_A[:8]) + 7
    assert limited.fingerprint != by_dir.fingerprint


def test_a_recursive_glob_through_a_link_loop_reads_each_file_once(tmp_path: Path) -> None:
    """``**`` follows links to folders: a link to the folder itself found each file under about
    40 names (loop/a.txt, loop/sub/a.txt, loop/sub/sub/a.txt...), and read its documents as often."""
    from ablate.data.sources import resolve_files

    corpus = write_text(tmp_path / "corpus", DOCS_A)
    (corpus / "sub").symlink_to(".")
    cfg = small(corpus="text", path=str(corpus / "**" / "*.txt"))
    assert [f.name for f in resolve_files(cfg)] == [f"{i:03d}.txt" for i in range(len(DOCS_A))]
    plain = load_data(small(corpus="text", path=str(corpus)), cache=tmp_path / "c1")
    looped = load_data(cfg, cache=tmp_path / "c2")
    assert stream(looped).numel() == stream(plain).numel()


def test_a_file_linked_under_a_second_name_is_read_once_and_the_left_out_name_said(
    tmp_path: Path,
) -> None:
    """A link made to read a file twice (upsampling) is read once, as a loop's names are: said,
    once, when the set is prepared, naming the first names left out and how many there are."""
    from ablate.data.prepared import prepare

    corpus = write_text(tmp_path / "corpus", DOCS_A[:4])
    (corpus / "up").mkdir()
    (corpus / "up" / "000.txt").symlink_to("../000.txt")
    said: list[str] = []
    cfg = small(corpus="text", path=str(corpus / "**" / "*.txt"))
    for _ in range(2):  # the second finds the set prepared: nothing said again
        prepare(cfg, cache=tmp_path / "c1", say=said.append)
    left_out = [line for line in said if "left out" in line]
    assert left_out == [
        f"data: data.path {cfg.path!r} finds 1 file(s) again under another name (through a "
        f"link); each file is read once, so these names are left out: {corpus}/up/000.txt (the "
        f"file of {corpus}/000.txt); to read a file twice, copy it"
    ]
    (corpus / "sub").symlink_to(".")  # a loop: many names, the first three said
    said.clear()
    prepare(cfg, cache=tmp_path / "c2", say=said.append)
    (line,) = [line for line in said if "left out" in line]
    n = int(re.search(r"finds (\d+) file", line)[1])  # type: ignore[index]
    assert n > 10 and line.count("(the file of") == 3 and f", and {n - 3} more; " in line
    said.clear()  # the folder itself finds each file once: nothing to say, the same tokens
    plain = prepare(small(corpus="text", path=str(corpus)), cache=tmp_path / "c3", say=said.append)
    assert len(said) == 1 and "left out" not in said[0], said
    looped = prepare(cfg, cache=tmp_path / "c2")
    assert plain.manifest["fingerprint"] == looped.manifest["fingerprint"]


def test_jsonl_without_the_text_field_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"data.text_field: .*bad.jsonl:2 .*'text'"):
        load_data(small(corpus="jsonl", path=str(path)))


@pytest.mark.parametrize("corpus", ["text", "jsonl"])
def test_a_bad_validation_corpus_file_names_data_val_not_the_training_path(
    tmp_path: Path, corpus: str
) -> None:
    """The error named data.path, the training corpus's field, for a file of data.val's."""
    from ablate.data.config import ValData

    train = write_text(tmp_path / "train", DOCS_A)
    bad = tmp_path / f"val.{'txt' if corpus == 'text' else 'jsonl'}"
    bad.write_bytes(b'{"text": "caf\xe9"}\n')
    cfg = small(corpus="text", path=str(train), val=ValData(corpus=corpus, path=str(bad)))
    with pytest.raises(ValueError, match=r"^data\.val\.path: .*val\.(txt|jsonl).* is not UTF-8"):
        load_data(cfg, cache=tmp_path / "cache")


def test_a_jsonl_line_nested_too_deep_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "fine"}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ValueError, match=r"data.path: .*deep.jsonl:2 is not a JSON object"):
        load_data(small(corpus="jsonl", path=str(path)))


# --- token shards ------------------------------------------------------------------------------


@pytest.mark.parametrize("token_dtype", ["uint16", "uint32"])
def test_token_shards_round_trip_via_memmap(tmp_path: Path, token_dtype: str) -> None:
    text = load_data(small(corpus="text", path=str(write_text(tmp_path / "txt", DOCS_A))))
    ids = stream(text)
    half = ids.numel() // 2
    for i, part in enumerate((ids[:half], ids[half:])):
        write_shard(tmp_path / f"shard_{i}.bin", part.tolist(), token_dtype)

    shards = load_data(
        small(corpus="tokens", path=str(tmp_path / "shard_*.bin"), token_dtype=token_dtype)
    )
    assert torch.equal(stream(shards), ids)
    assert torch.equal(shards.val.to(torch.int64), text.val.to(torch.int64))
    assert shards.fingerprint == text.fingerprint  # same tokens, same fingerprint
    assert shards.vocab_size == 257

    one = load_data(
        small(corpus="tokens", path=str(tmp_path / "shard_0.bin"), token_dtype=token_dtype)
    )
    assert one.train.dtype == torch.uint16  # prepared at the width its vocabulary (257) needs
    x, y = BatchSampler(one.train, 16, 4, 0).next()
    assert x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])


def test_token_shard_with_ids_outside_the_vocabulary_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    write_shard(path, [1000] * 8192, "uint16")
    with pytest.raises(ValueError, match=r"data.tokenizer: token id 1000 .* \(257\)"):
        load_data(small(corpus="tokens", path=str(path)))


def test_token_shard_of_odd_length_names_token_dtype(tmp_path: Path) -> None:
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 8191)
    with pytest.raises(ValueError, match="data.token_dtype"):
        load_data(small(corpus="tokens", path=str(tmp_path / "odd.bin")))


# --- Hugging Face datasets ---------------------------------------------------------------------


@pytest.mark.skipif(not HAS_DATASETS, reason="the optional 'datasets' package is not installed")
def test_hf_dataset_saved_to_disk_loads_like_the_same_text(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"text": DOCS_A}).save_to_disk(str(tmp_path / "ds"))
    hf = load_data(small(corpus="hf", hf_dataset=str(tmp_path / "ds")))
    text = load_data(small(corpus="text", path=str(write_text(tmp_path / "txt", DOCS_A))))
    assert hf.fingerprint == text.fingerprint
    assert hf.corpus_name == f"hf:{tmp_path / 'ds'}:train"

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS_B})}).save_to_disk(
        str(tmp_path / "dd")
    )
    assert (
        load_data(small(corpus="hf", hf_dataset=str(tmp_path / "dd"))).fingerprint != hf.fingerprint
    )
    with pytest.raises(ValueError, match="data.hf_split"):
        load_data(small(corpus="hf", hf_dataset=str(tmp_path / "dd"), hf_split="validation"))


@pytest.mark.skipif(not HAS_DATASETS, reason="the optional 'datasets' package is not installed")
def test_a_hub_dataset_out_of_reach_is_refused_naming_its_field(tmp_path, monkeypatch) -> None:
    """Offline with an empty datasets cache: ``hub_dataset_missing`` names the field (a local
    folder is no hub dataset), and reading it in a fresh process raises a ``ValueError`` naming
    the field instead of the ``datasets`` library's ``ConnectionError``."""
    from ablate.data import ValData
    from ablate.data.sources import hub_dataset_missing

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hub = ValData(corpus="hf", hf_dataset="allenai/c4", hf_config="en", max_documents=5)
    why = hub_dataset_missing(hub, "data.val.")
    assert why is not None and why.startswith("data.val.hf_dataset: 'allenai/c4' is a hub dataset")
    assert "HF_DATASETS_OFFLINE is set" in why and str(tmp_path / "hf-home" / "datasets") in why
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")  # datasets is online then, whatever the hub's
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert "127.0.0.1:9 unreachable" in str(hub_dataset_missing(hub, "data.val."))
    (tmp_path / "ds").mkdir()
    assert hub_dataset_missing(ValData(corpus="hf", hf_dataset=str(tmp_path / "ds")), "x.") is None
    code = (
        "from ablate.data import ValData; from ablate.data.sources import documents\n"
        "v = ValData(corpus='hf', hf_dataset='allenai/c4', hf_config='en', max_documents=5)\n"
        "try:\n    next(documents(v, [], 'data.val.'))\n"
        "except ValueError as e:\n    print(e)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.startswith("data.val.hf_dataset: cannot load 'allenai/c4' (ConnectionError")


@pytest.mark.skipif(HAS_DATASETS, reason="checks the message shown when 'datasets' is missing")
def test_hf_corpus_without_datasets_says_what_to_install() -> None:
    with pytest.raises(ImportError, match="pip install datasets"):
        load_data(small(corpus="hf", hf_dataset="allenai/c4", hf_config="en"))


# --- the held-out split ------------------------------------------------------------------------


def test_val_split_is_the_fixed_tail_disjoint_from_train() -> None:
    data = load_data(DataConfig(val_tokens=5000))
    other_seed = load_data(DataConfig(val_tokens=5000, data_seed=7))
    full = load_data(DataConfig(val_tokens=1))
    assert data.val.numel() == 5000
    n = data.train.numel()
    assert torch.equal(stream(data), stream(full))  # train + val is the whole stream, in order
    assert torch.equal(
        data.val.to(torch.int64), stream(full)[n:]
    )  # the val set is the last 5000 tokens
    assert torch.equal(other_seed.val, data.val)  # the data order never changes the val set
    assert n + data.val.numel() == stream(full).numel()  # so no token is in both


def test_val_batches_are_ordered_windows_with_the_ragged_tail_dropped() -> None:
    val = torch.arange(1000)
    batches = val_batches(val, seq_len=64, batch_size=4)
    again = val_batches(val, seq_len=64, batch_size=4)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(batches, again, strict=True)
    )
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert xs.shape == (15, 64) and [x.shape[0] for x, _ in batches] == [4, 4, 4, 3]  # 999 // 64
    assert torch.equal(xs.flatten(), val[: 15 * 64]) and torch.equal(
        ys.flatten(), val[1 : 15 * 64 + 1]
    )
    assert val_batches(torch.arange(64), seq_len=64, batch_size=4) == []


# --- the batch sampler -------------------------------------------------------------------------


def batches(sampler: BatchSampler, n: int) -> list[torch.Tensor]:
    return [sampler.next()[0] for _ in range(n)]


def test_sampler_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    tokens = torch.arange(10_001)
    a = batches(BatchSampler(tokens, 32, 8, data_seed=0), 5)
    b = batches(BatchSampler(tokens, 32, 8, data_seed=0), 5)
    c = batches(BatchSampler(tokens, 32, 8, data_seed=1), 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_sampler_visits_every_window_once_per_epoch_with_y_shifted_by_one() -> None:
    tokens = torch.arange(1001)  # 1000 // 10 = 100 windows; token value == its position
    sampler = BatchSampler(tokens, seq_len=10, batch_size=5, data_seed=3)
    assert sampler.tokens_per_batch == 50
    epochs = []
    for _ in range(2):
        starts = []
        for _ in range(20):
            x, y = sampler.next()
            assert x.shape == y.shape == (5, 10) and x.dtype == y.dtype == torch.int64
            assert torch.equal(y, x + 1)
            starts += x[:, 0].tolist()
        assert sorted(starts) == list(range(0, 1000, 10))
        epochs.append(starts)
    assert epochs[0] != epochs[1]  # a new permutation each epoch


def test_sampler_resume_via_state_dict_replays_identical_batches(tmp_path: Path) -> None:
    tokens = torch.arange(3001)
    uninterrupted = batches(BatchSampler(tokens, 16, 7, data_seed=5), 60)  # 187 windows: ~2 epochs

    first = BatchSampler(tokens, 16, 7, data_seed=5)
    head = batches(first, 26)  # stop mid-epoch 0 -> the 27th batch straddles epochs 0 and 1
    torch.save(first.state_dict(), tmp_path / "sampler.pt")
    resumed = BatchSampler(tokens, 16, 7, data_seed=5)
    resumed.load_state_dict(torch.load(tmp_path / "sampler.pt", weights_only=True))
    tail = batches(resumed, 34)
    assert all(torch.equal(x, y) for x, y in zip(uninterrupted, head + tail, strict=True))


def test_sampler_refuses_state_from_a_different_data_order() -> None:
    tokens = torch.arange(3001)
    state = BatchSampler(tokens, 16, 7, data_seed=5).state_dict()
    with pytest.raises(ValueError, match="data_seed=5"):
        BatchSampler(tokens, 16, 7, data_seed=6).load_state_dict(state)


def test_sampler_with_fewer_windows_than_a_batch_names_the_numbers() -> None:
    with pytest.raises(ValueError, match=r"100 tokens: 3 windows of seq_len 32 .* batch_size 8"):
        BatchSampler(torch.arange(100), 32, 8, 0)


# --- configuration errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"corpus": "wikipedia"}, "data.corpus: unknown corpus 'wikipedia'; expected one of"),
        ({"corpus": "text"}, "data.path: required for corpus 'text'"),
        ({"corpus": "builtin", "path": "x.txt"}, "data.path: not used by corpus 'builtin'"),
        ({"corpus": "hf"}, "data.hf_dataset: required"),
        ({"val_tokens": 0}, "data.val_tokens: must be an integer >= 1"),
        ({"max_documents": 0}, "data.max_documents"),
        ({"corpus": "tokens", "path": "x.bin", "max_documents": 3}, "data.max_documents"),
        ({"token_dtype": "int8"}, "data.token_dtype: 'int8'; expected one of"),
        ({"data_seed": -1}, "data.data_seed"),
    ],
)
def test_bad_config_raises_naming_the_field(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=re.escape(match)):
        DataConfig(**kwargs)  # type: ignore[arg-type]


def test_nonexistent_path_raises_file_not_found_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"data.path: '{missing}' does not exist")
    ):
        load_data(DataConfig(corpus="jsonl", path=str(missing)))
    with pytest.raises(FileNotFoundError, match="data.path: no files match"):
        load_data(DataConfig(corpus="text", path=str(tmp_path / "*.txt")))


def test_a_path_that_is_no_regular_file_is_named_as_such_not_as_missing(tmp_path: Path) -> None:
    from ablate.data import check_sources

    os.mkfifo(tmp_path / "pipe.txt")  # never opened: a read would wait for a writer
    (tmp_path / "loop.txt").symlink_to(tmp_path / "loop.txt")
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    cases = {
        "/dev/zero": "is not a regular file (a character device)",
        str(tmp_path / "pipe.txt"): "is not a regular file (a named pipe)",
        str(tmp_path / "loop.txt"): "is a symbolic link loop",
        str(tmp_path / "dangling.txt"): "is a link to a missing file",
    }
    for path, says in cases.items():
        for cfg, field in (
            (DataConfig(corpus="text", path=path), "data.path"),
            (DataConfig(val=ValData(corpus="text", path=path)), "data.val.path"),
        ):
            with pytest.raises(ValueError, match=re.escape(f"{field}: '{path}' {says}")):
                check_sources(cfg)


def test_too_short_corpus_names_the_token_counts(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text("x" * 1000)
    with pytest.raises(
        ValueError, match=r"has 1000 tokens, fewer than data.val_tokens \(65536\) \+ 4096"
    ):
        load_data(DataConfig(corpus="text", path=str(tmp_path / "tiny.txt")))
