"""A prepared set's layout on disk and its checks: the format (``FORMAT``), the manifest's file
(``MANIFEST``) and the token files' element types (``DTYPES``); ``check_set``, which reads a set's
manifest and checks every field a reader reads, the manifest's own digest (``manifest_digest``)
and each file's size (with ``verify``, its sha256); and ``Damaged``, what it raises for a set that
must not be trained on; ``changed_parts``, which parts of two sets' tokens differ. ``prepared``
writes sets in this layout and checks each one it uses here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ablate.data.tokenizer import load_tokenizer

FORMAT = 1
"""The layout of a prepared set; a set of another format is rebuilt."""
MANIFEST = "manifest.json"
DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
"""The element types of a set's token files, by the manifest's ``dtype``: little-endian."""


class Damaged(Exception):
    """A prepared set that must not be trained on (the reason is the message)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def check_set(path: Path, *, verify: bool) -> dict[str, Any]:
    """The manifest of the prepared set at ``path``, after checking it and each file's size (and
    with ``verify`` its sha256); raises ``Damaged`` saying what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise Damaged("no manifest: its preparation did not finish") from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise Damaged(f"unreadable manifest ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Damaged(f"a manifest of another format (expected {FORMAT})")
    _check_manifest(manifest, path)
    width = DTYPES[manifest["dtype"]].itemsize
    for name, f in manifest["files"].items():
        p = path / name
        try:
            size = p.stat().st_size
        except OSError:
            raise Damaged(f"{name} is missing") from None
        if size != f["tokens"] * width or size != f["bytes"]:
            raise Damaged(
                f"{name} has {size} bytes, the manifest says {f['bytes']} bytes for "
                f"{f['tokens']} tokens of {width} bytes"
            )
        if verify and _sha256(p) != f["sha256"]:
            raise Damaged(f"{name}'s checksum does not match the manifest's")
    return manifest


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The sha256 of a manifest's fields but ``digest`` (canonical JSON): an edit shows."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _check_manifest(m: dict[str, Any], path: Path) -> None:
    """Every field a reader reads (``load_data``, ``ablate data show``), in either style, of the
    type and range it must have; and the manifest's own digest (a set prepared before manifests
    had one: its vocabulary and end-of-text id against its tokenizer's). Raises ``Damaged`` (the
    set is then rebuilt)."""
    if m.get("dtype") not in DTYPES:
        raise Damaged(f"the manifest's dtype {m.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    files = m.get("files")
    if not isinstance(files, dict) or "train.bin" not in files:
        raise Damaged("the manifest's files are not a mapping holding train.bin")
    for name, f in files.items():
        if name not in ("train.bin", "val.bin") or not isinstance(f, dict):
            raise Damaged(f"the manifest names an unknown file {name!r}")
        ok = all(type(f.get(k)) is int and f[k] >= 0 for k in ("tokens", "bytes"))
        if not ok or not isinstance(f.get("sha256"), str):
            raise Damaged(f"the manifest's entry of {name} is malformed")
    vocab, eos = m.get("vocab_size"), m.get("eos_id")
    if type(vocab) is not int or not 0 < vocab <= np.iinfo(DTYPES[m["dtype"]]).max + 1:
        raise Damaged(f"the manifest's vocab_size {vocab!r} does not fit its dtype {m['dtype']}")
    if type(eos) is not int or not 0 <= eos < vocab:
        raise Damaged(f"the manifest's eos_id {eos!r} is outside its vocabulary ({vocab})")
    for k in ("key", "corpus", "tokenizer", "fingerprint"):
        if not isinstance(m.get(k), str):
            raise Damaged(f"the manifest's {k} is missing or not text")
    want = str if "val.bin" in files else type(None)  # the validation corpus's name iff val.bin
    if "val_corpus" not in m or not isinstance(m["val_corpus"], want):
        raise Damaged("the manifest's val_corpus is missing or does not match its files")
    if m["key"] != path.name:
        raise Damaged(f"the manifest's key {m['key']!r} is not its folder's name")
    if "tokenizer_file" not in m or not isinstance(m["tokenizer_file"], str | None):
        raise Damaged("the manifest's tokenizer_file is not a path")
    if "digest" in m:
        if m["digest"] != manifest_digest(m):
            raise Damaged("the manifest was changed after its set was prepared (its digest)")
        return
    try:  # before digests: what the tokens depend on, against the tokenizer itself
        tok = load_tokenizer(m["tokenizer_file"] or "byte")
    except (OSError, ValueError, ImportError) as e:
        raise Damaged(f"its tokenizer cannot be checked ({e})") from None
    if (tok.vocab_size, tok.eos_id) != (vocab, eos):
        raise Damaged(
            f"the manifest's vocab_size {vocab} and eos_id {eos} are not its tokenizer's "
            f"({tok.vocab_size}, {tok.eos_id})"
        )


def changed_parts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Which of two checked sets' tokens differ, from their manifests: ``data.tokenizer`` when
    their tokenizers differ (then every token may), else ``data.`` where their training tokens
    (``train.bin``) differ and ``data.val.`` where their validation tokens (``val.bin``) do."""
    if old["tokenizer"] != new["tokenizer"]:
        return ["data.tokenizer"]
    return [
        part
        for part, name in (("data.", "train.bin"), ("data.val.", "val.bin"))
        if (old["files"].get(name) or {}).get("sha256")
        != (new["files"].get(name) or {}).get("sha256")
    ]
