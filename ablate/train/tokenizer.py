"""Tokenizers: UTF-8 bytes (vocab 257 with EOS, the default) or a Hugging Face ``tokenizer.json``."""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    """Text <-> token ids. ``eos_id`` separates documents in the token stream."""

    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, plus EOS = 256: vocab 257, no training, no files."""

    def __init__(self) -> None:
        self.name = "byte"
        self.vocab_size = 257
        self.eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """EOS ids are dropped; a byte sequence cut mid-character decodes to U+FFFD."""
        return bytes(i for i in ids if i != self.eos_id).decode("utf-8", errors="replace")


# Tokens that end a document in common tokenizer files (GPT-2, Llama 3, Llama 2/Mistral, Gemma).
_EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (``pip install tokenizers``). Special tokens are not added;
    documents are separated by the file's end-of-text token."""

    def __init__(self, path: str) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data.tokenizer: no tokenizer file at {path!r}")
        tokenizers = _import_optional("tokenizers", "tokenizers", f"data.tokenizer={path!r}")
        self._tok = tokenizers.Tokenizer.from_file(path)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        self.name = f"hf:{Path(path).name}@{digest}"  # the content hash: same name, same tokens
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(t) for t in _EOS_CANDIDATES]
        found = [i for i in ids if i is not None]
        if not found:
            raise ValueError(
                f"data.tokenizer: {path} has none of the end-of-text tokens {_EOS_CANDIDATES}"
            )
        self.eos_id: int = found[0]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))


def load_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` -> ``ByteTokenizer``; anything else is the path of a ``tokenizer.json``."""
    return ByteTokenizer() if spec == "byte" else HFTokenizer(spec)


def _import_optional(module: str, pip_name: str, needed_for: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{needed_for} needs the optional package {pip_name!r}: pip install {pip_name}"
        ) from e
