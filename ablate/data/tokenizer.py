"""Tokenizers: UTF-8 bytes (vocab 257 with EOS, the default) or a Hugging Face tokenizer, from a
``tokenizer.json`` file, a folder holding one, or a hub name (``meta-llama/Llama-3.1-8B``).

``tokenizer_identity`` is what the prepared data's fingerprint holds of a tokenizer: the content
hash of a local file, the name of a hub tokenizer (its content hash goes into the manifest when it
is fetched)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ablate.data.paths import neither_file_nor_folder, not_a_file
from backends.env import truthy


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
    documents are separated by the file's end-of-text token. ``label`` names it in ``name`` (the
    file's name, or the hub name it was fetched for)."""

    def __init__(self, path: str, label: str | None = None) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data.tokenizer: no tokenizer file at {path!r}")
        tokenizers = import_optional("tokenizers", "tokenizers", f"data.tokenizer={path!r}")
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the Rust library raises a bare Exception for any bad file
            raise ValueError(
                f"data.tokenizer: {path} is not a readable Hugging Face tokenizer.json ({e})"
            ) from None
        self.path = path
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        # the content hash: same name, same tokens
        self.name = f"hf:{label or Path(path).name}@{digest}"
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


_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_name(spec: str) -> bool:
    """``org/name`` that is no local path: a Hugging Face hub tokenizer."""
    return bool(_HUB_NAME.match(spec)) and not spec.endswith(".json") and not os.path.exists(spec)


def tokenizer_kind(spec: str) -> str:
    """What ``data.tokenizer`` names: ``byte``, ``file`` (a tokenizer.json, or a folder holding
    one) or ``hub`` (``org/name`` that is no local path). Raises naming the field otherwise: a path
    (or its folder's ``tokenizer.json``) that is there but no file (a named pipe, a device, a
    symbolic link loop) as what it is, never opened."""
    if spec == "byte":
        return "byte"
    inner = os.path.join(spec, "tokenizer.json")
    checks = [(spec, neither_file_nor_folder)]
    if os.path.isdir(spec):
        checks.append((inner, not_a_file))
    for path, why_not in checks:  # there, but no file to read (a named pipe is never opened)
        if os.path.lexists(path) and (why := why_not(path)) is not None:
            raise ValueError(f"data.tokenizer: {path!r} {why}; {_GIVE}")
    if os.path.isfile(spec) or os.path.isfile(inner):
        return "file"
    if is_hub_name(spec):
        return "hub"
    raise FileNotFoundError(f"data.tokenizer: {spec!r} does not exist; {_GIVE}")


_GIVE = (
    "give 'byte', the path of a tokenizer.json (or of a folder holding one), or a Hugging Face hub "
    "name such as 'meta-llama/Llama-3.1-8B'"
)


def _local_file(spec: str) -> str:
    return spec if os.path.isfile(spec) else os.path.join(spec, "tokenizer.json")


def tokenizer_identity(spec: str) -> str:
    """The tokenizer's part of a data fingerprint, without loading it or touching the network:
    ``byte``, ``file:<sha256 of its content>`` or ``hub:<name>``."""
    kind = tokenizer_kind(spec)
    if kind == "file":
        return "file:" + hashlib.sha256(Path(_local_file(spec)).read_bytes()).hexdigest()[:16]
    return "byte" if kind == "byte" else f"hub:{spec}"


def hub_unreachable(timeout: float = 2.0, *, datasets: bool = False) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (``HF_HUB_OFFLINE``, or no TCP connection
    to ``HF_ENDPOINT`` within ``timeout`` seconds), or None when it can: asked once, so that a
    missing network is said at once instead of after the hub client's retries. ``datasets``: as the
    ``datasets`` library sees it, for which ``HF_DATASETS_OFFLINE``, where set, decides instead of
    ``HF_HUB_OFFLINE``."""
    flag = "HF_HUB_OFFLINE"
    if datasets and os.environ.get("HF_DATASETS_OFFLINE") is not None:
        flag = "HF_DATASETS_OFFLINE"
    if truthy(os.environ.get(flag)):  # as huggingface_hub reads it
        return f"{flag} is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    return _unreachable(endpoint, timeout)


@functools.lru_cache(maxsize=4)
def _unreachable(endpoint: str, timeout: float) -> str | None:
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except OSError as e:
        return f"{url.hostname}:{port} unreachable ({e.strerror or e})"
    return None


def fetch_hub_tokenizer(name: str, *, offline: bool = False) -> str:
    """The local path of hub model ``name``'s ``tokenizer.json``: from the Hugging Face cache, else
    downloaded (``HF_TOKEN`` for gated models such as Llama). Raises naming the field, and saying
    how to pass a local file, when it cannot be had."""
    hub = import_optional("huggingface_hub", "huggingface_hub", f"data.tokenizer={name!r}")
    try:
        return str(hub.hf_hub_download(name, "tokenizer.json", local_files_only=True))
    except Exception as e:
        if offline:  # not cached yet, and the caller will not wait for the network
            raise FileNotFoundError(f"data.tokenizer: {name!r} is not in the local cache") from e
    if (why := hub_unreachable()) is not None:
        raise FileNotFoundError(
            f"data.tokenizer: {name!r} is not in the Hugging Face cache and the hub cannot be "
            f"reached ({why}); download its tokenizer.json where there is a network and give its "
            "path: data.tokenizer: /path/to/tokenizer.json"
        )
    try:
        return str(hub.hf_hub_download(name, "tokenizer.json"))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(
            f"data.tokenizer: cannot fetch {name!r} from the Hugging Face hub ({first[:200]}); "
            "with no network, or for a gated model without access (set HF_TOKEN), download its "
            "tokenizer.json where you can and give its path: data.tokenizer: /path/to/tokenizer.json"
        ) from None


def load_tokenizer(spec: str, *, offline: bool = False) -> Tokenizer:
    """``"byte"`` -> ``ByteTokenizer``; a ``tokenizer.json`` (or a folder holding one) or a hub name
    -> ``HFTokenizer`` (a hub tokenizer is fetched once into the Hugging Face cache; ``offline``:
    only from there)."""
    kind = tokenizer_kind(spec)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "hub":
        return HFTokenizer(fetch_hub_tokenizer(spec, offline=offline), label=spec)
    return HFTokenizer(_local_file(spec))


def import_optional(module: str, pip_name: str, needed_for: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{needed_for} needs the optional package {pip_name!r}: pip install {pip_name}"
        ) from e
