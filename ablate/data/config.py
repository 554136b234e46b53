"""Training data's configuration: ``DataConfig`` (with ``data.val``, a validation corpus of its
own) and the checks of its fields, each error naming its field.

- corpora: the built-in one (Python's own documentation, no download; the default), local text /
  JSONL / Parquet files, Hugging Face datasets, and pre-tokenized binary shards; how each is read
  is ``sources.py``'s;
- tokenizers: UTF-8 bytes (vocab 257 with EOS) or a Hugging Face tokenizer (a ``tokenizer.json``,
  a folder holding one, or a hub name; ``tokenizer.py``);
- the split: without ``data.val`` the *last* ``val_tokens`` tokens of the stream are the fixed
  validation set, never trained on; with it, the first ``val_tokens`` of that corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from ablate.key import always, unless_default

Corpus = Literal["builtin", "text", "jsonl", "parquet", "hf", "tokens"]
TokenDtype = Literal["uint16", "uint32"]

FILE_EXT: dict[str, str] = {
    "text": ".txt",
    "jsonl": ".jsonl",
    "parquet": ".parquet",
    "tokens": ".bin",
}


SEED_LIMIT = 2**32
"""Seeds (model and data order) are below this: every random stream they key accepts them."""


def check_source(src: DataConfig | ValData, field: str) -> None:
    """The checks a corpus's fields share, in the training data (``data.``) and in ``data.val.``."""
    corpora = get_args(Corpus)
    if src.corpus not in corpora:
        raise ValueError(f"{field}corpus: unknown corpus {src.corpus!r}; expected one of {corpora}")
    if src.corpus in FILE_EXT and not src.path:
        raise ValueError(
            f"{field}path: required for corpus {src.corpus!r} "
            f"(a file, a directory of {FILE_EXT[src.corpus]} files, or a glob)"
        )
    if src.corpus not in FILE_EXT and src.path is not None:
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
        if not is_int(src.max_documents) or src.max_documents < 1:
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

    corpus: Corpus = field(metadata=always())
    """As ``data.corpus``: text, jsonl, parquet, hf, tokens (builtin: no separate split exists)."""
    path: str | None = field(default=None, metadata=always())
    text_field: str = field(default="text", metadata=always())
    hf_dataset: str | None = field(default=None, metadata=always())
    hf_config: str | None = field(default=None, metadata=always())
    hf_split: str = field(default="validation", metadata=always())
    """For corpus ``hf``: the split to read (default ``validation``)."""
    max_documents: int | None = field(default=None, metadata=always())
    token_dtype: TokenDtype = field(default="uint16", metadata=always())

    def __post_init__(self) -> None:
        if self.corpus == "builtin":
            raise ValueError(
                "data.val.corpus: 'builtin' has no separate validation split; leave data.val unset "
                "to validate on the held-out tail of the training stream"
            )
        check_source(self, "data.val.")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where the training tokens come from, how they are split, and in what order they are seen."""

    corpus: Corpus = field(default="builtin", metadata=always())
    """``builtin``: Python's documentation and docstrings, no download. ``text``: ``.txt`` files, one
    document each. ``jsonl``: one JSON object per line. ``parquet``: a string column. ``hf``: a Hugging
    Face dataset. ``tokens``: pre-tokenized ``.bin`` shards of raw little-endian token ids."""
    path: str | None = field(default=None, metadata=always())
    """A file, a directory (its files with the corpus's extension, not recursive) or a glob
    (``**`` recurses). Required for text/jsonl/parquet/tokens; files are read in name order."""
    text_field: str = field(default="text", metadata=always())
    """The JSON field, Parquet column or dataset column holding the text (jsonl, parquet, hf)."""
    hf_dataset: str | None = field(default=None, metadata=always())
    """For corpus ``hf``: a hub name (``allenai/c4``) or a local directory written by
    ``Dataset.save_to_disk``."""
    hf_config: str | None = field(default=None, metadata=always())
    """For corpus ``hf``: the dataset configuration (``en`` for C4)."""
    hf_split: str = field(default="train", metadata=always())
    """For corpus ``hf``: the split to read."""
    max_documents: int | None = field(default=None, metadata=always())
    """Read at most this many documents (all corpora but ``tokens``); ``None`` reads them all."""
    tokenizer: str = field(default="byte", metadata=always())
    """``byte`` (UTF-8 bytes + EOS, vocab 257), the path of a Hugging Face ``tokenizer.json`` (or of
    a folder holding one), or a hub name such as ``meta-llama/Llama-3.1-8B`` (fetched once; gated
    models need ``HF_TOKEN``)."""
    token_dtype: TokenDtype = field(default="uint16", metadata=always())
    """Element type of the ``tokens`` shards; ``uint16`` holds vocabularies up to 65536."""
    val_tokens: int = field(default=65536, metadata=always())
    """Size of the fixed validation set: the last ``val_tokens`` of the token stream, never trained
    on, or with ``val`` the first ``val_tokens`` of that corpus."""
    val: ValData | None = field(default=None, metadata=unless_default())
    """A validation corpus of its own (``{corpus: hf, hf_dataset: allenai/c4, hf_config: en,
    hf_split: validation}``); then the whole training stream is trained on. None: the tail."""
    data_seed: int | None = field(default=None, metadata=always())
    """Seed of the order of training batches. None (the default): the run's ``seed``, so each seed
    of a study reads its own batch order and a conclusion does not rest on one order (a
    ``RunConfig`` resolves it, and its key holds the number); an integer fixes one order for every
    seed (0 is the order every seed read before 2026-11-26)."""

    def __post_init__(self) -> None:
        if isinstance(self.val, dict):  # from a run's config.json or a task's dict
            self.val = ValData(**self.val)
        check_source(self, "data.")
        if not self.tokenizer:
            raise ValueError(
                "data.tokenizer: 'byte', the path of a tokenizer.json or a hub name, got ''"
            )
        if not is_int(self.val_tokens) or self.val_tokens < 1:
            raise ValueError(f"data.val_tokens: must be an integer >= 1, got {self.val_tokens!r}")
        if self.data_seed is not None and (
            not is_int(self.data_seed) or not 0 <= self.data_seed < SEED_LIMIT
        ):
            raise ValueError(
                "data.data_seed: must be an integer in [0, 2^32), or null for the run's seed; "
                f"got {self.data_seed!r}"
            )


BATCH_FIELDS = ("data_seed", "val_tokens")
"""``DataConfig`` fields that take a run's batches from the same tokens (they split and order them):
no part of a prepared set's key (``prepared.data_identity``) nor of its ``data.fingerprint``."""


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
