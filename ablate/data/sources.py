"""Where a corpus's documents come from: the files it reads (``resolve_files``, each real file once,
checked before anything runs by ``check_sources``; ``left_out_names`` says which links to an already
found file it leaves out), whether a hub dataset can be had here (``hub_dataset_missing``: in the
``datasets`` cache, or the hub reachable), its documents in order (``documents``: the built-in
corpus, text, JSONL, Parquet, Hugging Face datasets), its readable name and what of it decides its
tokens (``source_identity``, which the prepared set's key holds) and whether its files changed while
they were read, or since a key was computed (``file_states``, ``changed_states``,
``check_unchanged``). Optional packages (``pyarrow``, ``datasets``) are imported only by the code
that reads those formats."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from glob import glob
from itertools import islice
from pathlib import Path
from typing import Any

from ablate.data.config import FILE_EXT, DataConfig, ValData
from ablate.data.corpus import builtin_documents
from ablate.data.paths import neither_file_nor_folder, not_a_file
from ablate.data.tokenizer import hub_unreachable, import_optional, tokenizer_kind


def resolve_files(src: DataConfig | ValData, field: str = "data.") -> list[Path]:
    """The files a file corpus reads, in name order, each real file once (``found_files``, the
    first of its names); raises naming ``{field}path``."""
    return sorted(_once(found_files(src, field)).values(), key=str)


def _once(files: list[Path]) -> dict[str, Path]:
    """Each real file of ``files`` with its first name in name order. Once, because ``**`` follows
    links to folders: a link to a folder above it (a loop) gave the same file under 40 names, and
    its documents 40 times."""
    once: dict[str, Path] = {}
    for f in sorted(files, key=str):
        once.setdefault(os.path.realpath(f), f)
    return once


def found_files(src: DataConfig | ValData, field: str = "data.") -> list[Path]:
    """Every name under which a file corpus's ``path`` finds a file, links to one file included;
    raises naming ``{field}path``."""
    spec, ext = str(src.path), FILE_EXT[src.corpus]
    if any(c in spec for c in "*?["):
        files = [Path(p) for p in glob(spec, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(spec):
        files = [p for p in Path(spec).iterdir() if p.is_file() and p.name.endswith(ext)]
    elif (why := not_a_file(spec)) is None:
        files = [Path(spec)]
    elif why == "does not exist":
        raise FileNotFoundError(f"{field}path: {spec!r} does not exist")
    else:  # a device, a named pipe (never opened), a link loop
        raise ValueError(f"{field}path: {spec!r} {why}; give a file or a folder of files")
    if not files:
        raise FileNotFoundError(
            f"{field}path: no files match {spec!r} (a directory is searched for *{ext})"
        )
    return files


def left_out_names(cfg: DataConfig, shown: int = 3) -> list[str]:
    """One line per corpus (``cfg``'s, its ``val``'s) naming the names ``resolve_files`` leaves out
    because they are links to a file found under another name (the first ``shown`` and how many):
    the corpus reads that file once, where a link made to read it twice (upsampling) would not."""
    lines = []
    for src, field in ((cfg, "data."), (cfg.val, "data.val.")):
        if src is None or src.corpus not in FILE_EXT:
            continue
        found = found_files(src, field)
        kept = _once(found)
        out = sorted((f for f in found if kept[os.path.realpath(f)] is not f), key=str)
        if not out:
            continue
        names = [f"{f} (the file of {kept[os.path.realpath(f)]})" for f in out[:shown]]
        more = f", and {len(out) - shown} more" if len(out) > shown else ""
        lines.append(
            f"data: {field}path {str(src.path)!r} finds {len(out)} file(s) again under another "
            f"name (through a link); each file is read once, so these names are left out: "
            f"{', '.join(names)}{more}; to read a file twice, copy it"
        )
    return lines


def check_sources(cfg: DataConfig) -> None:
    """Fail fast on inputs that do not exist, or are no file or folder to read (a named pipe, a
    device, a symbolic link loop: data files, the validation corpus's files, a local dataset, a
    tokenizer file), before any training starts, without the network (a hub tokenizer is fetched
    when the data is prepared); relative paths are taken from the current directory."""
    for src, field in ((cfg, "data."), (cfg.val, "data.val.")):
        if src is not None and src.corpus == "hf":
            _check_local_dataset(str(src.hf_dataset), field)
        if src is None or src.corpus not in FILE_EXT:
            continue
        files = resolve_files(src, field)
        if src.corpus == "parquet":  # the footers only: the column is there and holds text
            pq = import_optional("pyarrow.parquet", "pyarrow", f"{field}corpus='parquet'")
            for f in files:
                _parquet_text_column(pq, f, src.text_field, field)
    tokenizer_kind(cfg.tokenizer)


def _check_local_dataset(name: str, field: str) -> None:
    """Refuses, naming ``{field}hf_dataset``, a local path there that is neither a folder nor a
    file (a named pipe, a device, a symbolic link loop, a dangling link): never read, nor taken for
    a hub name. A name with nothing at it is a hub name."""
    if os.path.lexists(name) and (why := neither_file_nor_folder(name)) is not None:
        raise ValueError(
            f"{field}hf_dataset: {name!r} {why}; give the folder Dataset.save_to_disk wrote, or "
            "a hub name such as 'allenai/c4'"
        )


def _parquet_text_column(pq: Any, f: Path, text_field: str, field: str = "data.") -> Any:
    """The ``ParquetFile`` of ``f``, refused (naming the field) unless it is a Parquet file with a
    text column ``text_field``."""
    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # noqa: BLE001 (pyarrow's errors for a file that is not Parquet)
        raise ValueError(f"{field}path: {f} is not a readable Parquet file ({e})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise ValueError(
            f"{field}text_field: {f} has no column {text_field!r} (has {schema.names})"
        )
    kind = schema.field(text_field).type
    if str(kind) not in ("string", "large_string", "string_view"):
        raise ValueError(
            f"{field}text_field: {f}'s column {text_field!r} holds {kind}, not text; name the "
            "column that holds the documents"
        )
    return pf


def is_hub_dataset(src: DataConfig | ValData) -> bool:
    """Whether ``src`` reads a Hugging Face hub dataset: corpus ``hf`` naming no local path."""
    return src.corpus == "hf" and not os.path.exists(str(src.hf_dataset))


def datasets_cache() -> Path:
    """The ``datasets`` library's cache folder, found as it finds it: ``HF_DATASETS_CACHE``, else
    ``datasets`` under ``HF_HOME``, else under ``$XDG_CACHE_HOME/huggingface`` (``~/.cache``)."""
    if given := os.environ.get("HF_DATASETS_CACHE"):
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(home).expanduser() / "datasets"


def _in_datasets_cache(name: str) -> bool:
    """Whether ``datasets`` holds hub dataset ``name`` in its cache (its folder
    ``<namespace>___<name in snake case>/<config>/<version>/<hash>``), as it looks offline."""
    naming = import_optional("datasets.naming", "datasets", "data.corpus='hf'")
    parts = name.split("/")
    parts[-1] = naming.camelcase_to_snakecase(parts[-1])
    return any(p.is_dir() for p in (datasets_cache() / "___".join(parts)).glob("*/*/*"))


def hub_dataset_missing(src: DataConfig | ValData, field: str) -> str | None:
    """Why ``src``'s hub dataset cannot be read here, said at once rather than after the hub
    client's retries: it is not in the ``datasets`` cache and the hub cannot be reached
    (``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``, or no connection). None when it can be read, or
    is no hub dataset. Whether the data is prepared already is the caller's to ask first."""
    if not is_hub_dataset(src):
        return None
    name = str(src.hf_dataset)
    why = hub_unreachable(datasets=True)
    if why is None or _in_datasets_cache(name):
        return None
    return (
        f"{field}hf_dataset: {name!r} is a hub dataset, not in the datasets cache "
        f"({datasets_cache()}), and the hub cannot be reached ({why}); give a local copy "
        f"({field}corpus: jsonl, parquet or text with {field}path, or the folder "
        f"Dataset.save_to_disk wrote as {field}hf_dataset), prepare the data where the hub "
        "answers into the same data_cache (ablate data prepare), or run where the hub answers"
    )


def source_files(src: DataConfig | ValData, field: str = "data.") -> list[Path]:
    """The local files a corpus reads (a local ``save_to_disk`` dataset's files too): their names,
    sizes and modification times are part of the prepared data's fingerprint."""
    if src.corpus in FILE_EXT:
        return resolve_files(src, field)
    if src.corpus == "hf" and os.path.isdir(str(src.hf_dataset)):
        return sorted(p for p in Path(str(src.hf_dataset)).rglob("*") if p.is_file())
    return []


def _path_field(corpus: str, field: str) -> str:
    return f"{field}{'hf_dataset' if corpus == 'hf' else 'path'}"


def file_states(cfg: DataConfig) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Each local file ``cfg`` reads (its validation corpus's too), as ``(field naming it, resolved
    name)``: its size, modification time (ns) and inode; a preparation compares them before and
    after it reads."""
    out = {}
    for src, field in ((cfg, "data."), (cfg.val, "data.val.")):
        if src is None:
            continue
        for f in source_files(src, field):
            st = f.stat()
            name = (_path_field(src.corpus, field), str(f.resolve()))
            out[name] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def keyed_states(train: dict[str, Any], val: dict[str, Any] | None) -> dict[tuple[str, str], Any]:
    """The files of two ``source_identity`` (the corpus's, the validation corpus's) as
    ``file_states`` names them: their size and modification time when the key was computed."""
    return {
        (_path_field(src["corpus"], field), f[0]): tuple(f[1:])
        for src, field in ((train, "data."), (val, "data.val."))
        if src is not None
        for f in src["files"]
    }


def changed_states(
    before: Mapping[tuple[str, str], tuple[int, ...]],
    after: Mapping[tuple[str, str], tuple[int, ...]],
) -> list[tuple[str, str, str]]:
    """Each file that appeared, went away or changed between ``before`` and ``after``
    (``file_states``, or the size and time a key was computed from), in order, as ``(field naming
    it, file, "appeared" | "went away" | "changed")``."""
    out = []
    for field, f in sorted(before.keys() | after.keys()):
        was, now = before.get((field, f)), after.get((field, f))
        if was != now:
            out.append(
                (field, f, "appeared" if was is None else "went away" if now is None else "changed")
            )
    return out


def check_unchanged(
    before: Mapping[tuple[str, str], tuple[int, ...]],
    after: Mapping[tuple[str, str], tuple[int, ...]],
) -> None:
    """Raises ValueError naming the first file that appeared, went or changed between ``before``
    and ``after`` (``changed_states``)."""
    for field, f, what in changed_states(before, after)[:1]:
        raise ValueError(
            f"{field}: {f} {what} while the data was prepared; nothing was stored: prepare it "
            "again once its files no longer change"
        )


def _text_documents(files: list[Path], field: str) -> Iterator[str]:
    for f in files:
        try:
            yield f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{field}path: {f} is not UTF-8 text ({e})") from e


def _jsonl_documents(files: list[Path], text_field: str, field: str) -> Iterator[str]:
    for f in files:
        with open(f, "rb") as raw:
            for lineno, data in enumerate(raw, 1):
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(
                        f"{field}path: {f}:{lineno} is not UTF-8 text (byte {data[e.start]:#04x} "
                        f"at column {e.start + 1})"
                    ) from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{field}path: {f}:{lineno} is not a JSON object ({e})") from e
                except RecursionError:
                    raise ValueError(
                        f"{field}path: {f}:{lineno} is not a JSON object (nested too deep to read)"
                    ) from None
                text = row.get(text_field) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                    raise ValueError(
                        f"{field}text_field: {f}:{lineno} has no string field {text_field!r} (has {keys})"
                    )
                yield text


def _parquet_documents(files: list[Path], text_field: str) -> Iterator[str]:
    pq = import_optional("pyarrow.parquet", "pyarrow", "data.corpus='parquet'")
    for f in files:
        pf = _parquet_text_column(pq, f, text_field)
        for batch in pf.iter_batches(columns=[text_field], batch_size=4096):
            yield from (t for t in batch.column(0).to_pylist() if t is not None)


def _hf_documents(cfg: DataConfig | ValData, field: str) -> Iterator[str]:
    datasets = import_optional("datasets", "datasets", f"{field}corpus='hf'")
    name = str(cfg.hf_dataset)
    local = Path(name)
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        ds = datasets.load_from_disk(name)  # written by save_to_disk
        if isinstance(ds, datasets.DatasetDict):
            if cfg.hf_split not in ds:
                raise ValueError(
                    f"{field}hf_split: {name} has no split {cfg.hf_split!r} (has {sorted(ds)})"
                )
            ds = ds[cfg.hf_split]
    elif cfg.max_documents is not None:
        # stream: a limited read of a hub dataset (C4 is hundreds of GB) fetches only what it uses
        stream = _load_dataset(datasets, cfg, field, streaming=True)
        for row in islice(stream, cfg.max_documents):
            if cfg.text_field not in row:
                raise ValueError(
                    f"{field}text_field: {name} has no column {cfg.text_field!r} (has {sorted(row)})"
                )
            if row[cfg.text_field] is not None:
                yield row[cfg.text_field]
        return
    else:
        ds = _load_dataset(datasets, cfg, field, streaming=False)
    if cfg.text_field not in ds.column_names:
        raise ValueError(
            f"{field}text_field: {name} has no column {cfg.text_field!r} (has {ds.column_names})"
        )
    if cfg.max_documents is not None:
        ds = ds.select(range(min(cfg.max_documents, len(ds))))
    yield from (t for t in ds[cfg.text_field] if t is not None)


def _load_dataset(datasets: Any, cfg: DataConfig | ValData, field: str, *, streaming: bool) -> Any:
    """``datasets.load_dataset`` of ``cfg``; a dataset it cannot reach is refused naming the field."""
    name = str(cfg.hf_dataset)
    try:
        return datasets.load_dataset(name, cfg.hf_config, split=cfg.hf_split, streaming=streaming)
    except OSError as e:  # not on the hub, or the hub not reached (ConnectionError)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ValueError(
            f"{field}hf_dataset: cannot load {name!r} ({type(e).__name__}: {first}); give a "
            f"local copy ({field}corpus with {field}path, or a save_to_disk folder), or run where "
            "the hub answers"
        ) from None


def documents(cfg: DataConfig | ValData, files: list[Path], field: str = "data.") -> Iterator[str]:
    """The corpus's non-empty documents in order, at most ``max_documents`` (not ``tokens``);
    ``field`` (``data.`` or ``data.val.``) names the corpus in errors."""
    if cfg.corpus == "builtin":
        docs: Iterable[str] = builtin_documents()
    elif cfg.corpus == "text":
        docs = _text_documents(files, field)
    elif cfg.corpus == "jsonl":
        docs = _jsonl_documents(files, cfg.text_field, field)
    elif cfg.corpus == "parquet":
        docs = _parquet_documents(files, cfg.text_field)
    else:
        docs = _hf_documents(cfg, field)
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


def source_identity(src: DataConfig | ValData, field: str) -> dict[str, Any]:
    """What of a corpus decides its tokens: its fields, and its local files' names, sizes and
    modification times (a prepared set's key holds it; no network)."""
    files = [
        [str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in source_files(src, field)
    ]
    return {
        "name": corpus_name(src),
        "corpus": src.corpus,
        "path": src.path,
        "text_field": src.text_field,
        "hf_dataset": src.hf_dataset,
        "hf_config": src.hf_config,
        "hf_split": src.hf_split,
        "max_documents": src.max_documents,
        "token_dtype": src.token_dtype if src.corpus == "tokens" else None,
        "files": files,
    }
