"""Writing a Hugging Face checkpoint folder: ``export_model`` (a run's configuration and weights),
``export_checkpoint`` (a run's checkpoint folder) and ``export_cell`` (a study's cell by its label;
a baseline seed reused from another study, ``baseline_from``, from that study's checkpoint).

The folder holds ``config.json``, ``model.safetensors`` (the high-precision master weights, float32
unless asked otherwise), the tokenizer when the run's is a Hugging Face one (``tokenizer.json`` and
a minimal ``tokenizer_config.json``) and ``ablate_export.json``: where the weights come from (study,
cell, run, step, recipe, code), the token ids of a byte tokenizer, and where the model departs from
the architecture it is exported as. An existing folder that is not empty is refused unless
``force``, which replaces only the files an export writes, and only those of a previous export
(a folder that holds such files without ``ablate_export.json`` is refused). A folder inside what
a study records (``tracking.places.recorded_places``: its output folder, with the MLflow store and the cells' checkpoints, and a
SQLite store's artifacts elsewhere) is refused, whatever ``force``: no place in there is meant
for other files, and an export there would sit among, or replace, what the study recorded.

Atomic: the export is written into a hidden folder beside ``out`` and moved into place only once
complete, so a failure leaves ``out`` as it was (a previous export's files included, and no new
folder behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ablate.errors import AblateError
from ablate.export.mapping import DEPARTURES, QUANT_BUFFERS, hf_checkpoint
from ablate.export.weights import ExportError, RunWeights, read_checkpoint, safetensors_torch
from ablate.tracking.places import place_holding, recorded_places

if TYPE_CHECKING:
    from ablate.study import Cell, Study
    from ablate.tracking.runs import CellRun
    from ablate.train.config import RunConfig

METADATA = "ablate_export.json"
FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    METADATA,
)
"""What an export writes (``force`` replaces these, and nothing else, in an existing folder)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WEIGHTS_NOTE = (
    "the high-precision master weights: a recipe's quantized layers (backends.QuantLinear) keep a "
    "high-precision weight and quantize it inside each GEMM; no FP4 or FP8 codes are written, so "
    "this checkpoint computes the unquantized model"
)
BYTE_IDS = "ids 0-255: the bytes of the UTF-8 text; 256: EOS (end of document); no other tokens"


def export_cell(
    study: Study | str | Path,
    label: str,
    out_dir: str | Path,
    *,
    force: bool = False,
    dtype: str = "float32",
    output: str | Path | None = None,
) -> Path:
    """Export the latest checkpoint of ``study``'s cell ``label`` (its label or its key) to
    ``out_dir``; ``study`` is a loaded ``Study`` or a study file (``output``: its output folder
    when not the default). A finished cell keeps its final weights; an interrupted one its last
    checkpoint (every ``train.checkpoint_every`` steps). Returns ``out_dir``."""
    from ablate.study import load_study

    if not isinstance(study, str | Path):
        s = study
    else:
        s = load_study(study, output=Path(output) if output else None)
    if not str(out_dir).strip():  # Path("") is the current folder
        raise ExportError("-o: an empty path; give the folder to write (e.g. exported/<cell>)")
    refuse_inside(out_dir, recorded_places(s))
    check_out(Path(out_dir), force)  # before the checkpoint is read (seconds for a large model)
    cell = find_cell(s, label)
    ckpt = s.checkpoint_dir(cell)
    run = _run(s, cell)
    meta = {"study": s.name, "cell": cell.label, "key": cell.key, "run_id": _run_id(run)}
    if not ckpt.exists() and run is not None and run.reused_from:
        ckpt = _reused_checkpoint(s, cell, run)
        refuse_inside(
            out_dir, {"the output folder of the study it was reused from": ckpt.parents[1]}
        )
        meta |= {"reused_from": run.reused_from, "reused_run": run.reused_run}
    try:
        weights = read_checkpoint(ckpt)
    except ExportError:
        raise ExportError(
            f"export: cell {cell.label} of study {s.name} has no checkpoint in {ckpt}; run the "
            "study first (a cell checkpoints at its end and every train.checkpoint_every steps)"
        ) from None
    return export_model(cell.config, weights, out_dir, force=force, dtype=dtype, meta=meta)


def _reused_checkpoint(study: Study, cell: Cell, run: CellRun) -> Path:
    """The checkpoint of a baseline seed copied from another study (``baseline_from``): the
    folder of the same key (the same configuration) beside the SQLite store of the study it
    trained in (``reused_from``: ``BaselineSource.label``; a study's output folder holds its store
    by default), else in the output folder of the study file ``baseline_from`` names, or of the
    one that study's ``baseline_from`` names in turn (``_source_folders``: the study it trained in
    first); ``ExportError`` saying where the seed came from when none holds one."""
    from ablate.tracking.store import sqlite_path

    looked: list[Path] = []
    _, _, uri = run.reused_from.partition(" in ")  # "study <name> in <uri>"
    with contextlib.suppress(AblateError):
        if (db := sqlite_path(uri)) is not None:
            looked.append(db.parent / "cells" / cell.key)
    looked += _source_folders(study, cell, run.reused_from)
    for where in looked:
        if where.exists():
            return where
    places = " or ".join(str(p) for p in dict.fromkeys(looked)) or "a folder of that study"
    raise ExportError(
        f"export: cell {cell.label} of study {study.name} is a baseline seed reused from "
        f"{run.reused_from} (its run {run.reused_run} there), with no checkpoint in {places}: "
        "export it from that study, where it trained (ablate export <that study's file> --cell "
        f"{cell.key})"
    )


def _source_folders(study: Study, cell: Cell, trained_in: str) -> list[Path]:
    """The cell's folder in the output folder of the study file ``study``'s ``baseline_from``
    names and, where that study reused its baseline too, of the one its ``baseline_from`` names,
    and so on (a seed copied from a study that had copied it trained further up): the study
    ``trained_in`` names (``BaselineSource.label``) first. For a store that is a server, these
    study files are all that says where its cells' checkpoints are."""
    from ablate.errors import StudyError
    from ablate.study import load_study
    from ablate.study.baseline_from import BaselineSource

    found: list[Path] = []
    spec, seen = study.file.baseline_from, set()
    while spec is not None and spec.study is not None and spec.study not in seen:
        seen.add(spec.study)
        try:
            other = load_study(spec.study, check_files=False)
        except StudyError:
            break
        where = other.checkpoint_dir(cell).resolve()
        label = BaselineSource(other.tracking_uri, other.name, other.experiment).label
        if label == trained_in:
            found.insert(0, where)
        else:
            found.append(where)
        spec = other.file.baseline_from
    return found


def refuse_inside(out_dir: str | Path, places: dict[str, Path]) -> None:
    """``ExportError`` naming ``-o/--out`` when ``out_dir`` is one of ``places`` or inside one,
    symbolic links and ``..`` resolved on both sides; before anything is read or written."""
    held = place_holding(out_dir, places)
    if held is not None:
        what, root = held
        raise ExportError(
            f"-o/--out: {out_dir} is inside {what}, {root}, which holds what the study "
            "recorded; an export there would sit among or replace it, so nothing was "
            "written: give a folder outside it (e.g. exported/<study>-<cell>)"
        )


def find_cell(study: Study, label: str) -> Cell:
    """The cell of ``study`` with this label (or key); ``ExportError`` listing the labels if none."""
    for c in study.cells:
        if label in (c.label, c.key):
            return c
    shown = ", ".join(c.label for c in study.cells[:30])
    more = f" (and {len(study.cells) - 30} more)" if len(study.cells) > 30 else ""
    raise ExportError(f"--cell: study {study.name} has no cell {label!r}; its cells: {shown}{more}")


def export_checkpoint(
    config: RunConfig,
    checkpoint_dir: str | Path | None = None,
    out_dir: str | Path = "export",
    *,
    force: bool = False,
    dtype: str = "float32",
) -> Path:
    """Export the checkpoint of a run of ``config`` in ``checkpoint_dir`` (default: its
    ``checkpoint_dir``), refused when another configuration wrote it."""
    from ablate.train.config import config_hash

    where = checkpoint_dir or config.checkpoint_dir
    if where is None:
        raise ExportError("export: no checkpoint_dir given, and the run's config sets none")
    refuse_inside(out_dir, {"the checkpoint folder it exports": Path(where)})
    weights = read_checkpoint(where)
    if weights.config_hash != config_hash(config):
        raise ExportError(
            f"export: {where} was written by another configuration "
            f"({weights.config_hash} != {config_hash(config)})"
        )
    return export_model(config, weights, out_dir, force=force, dtype=dtype)


def export_model(
    config: RunConfig,
    weights: RunWeights | nn.Module | dict[str, torch.Tensor],
    out_dir: str | Path,
    *,
    force: bool = False,
    dtype: str = "float32",
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write the model of ``config`` with ``weights`` (a checkpoint's ``RunWeights``, the model, or
    its state dict) as a Hugging Face checkpoint in ``out_dir`` (module docstring)."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype: unknown {dtype!r}; allowed: {', '.join(DTYPES)}")
    run = weights if isinstance(weights, RunWeights) else None
    if isinstance(weights, nn.Module):
        state = weights.state_dict()
    else:
        state = weights.state if isinstance(weights, RunWeights) else weights
    with _staged(Path(out_dir), force) as out:
        _write(out, config, state, run, dtype, meta)
    return Path(out_dir)


def _write(
    out: Path,
    config: RunConfig,
    state: dict[str, torch.Tensor],
    run: RunWeights | None,
    dtype: str,
    meta: dict[str, Any] | None,
) -> None:
    hf_spec = config.model.hf
    tok = _tokenizer(config.data.tokenizer)
    hf_config, hf_state = hf_checkpoint(config, state, eos_id=tok["eos_id"])
    hf_config["torch_dtype"] = hf_config["dtype"] = dtype
    tensors = {
        k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in hf_state.items()
    }
    safetensors_torch().save_file(
        tensors, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    _write_json(out / "config.json", hf_config)
    gen = {"bos_token_id": hf_config.get("bos_token_id"), "eos_token_id": tok["eos_id"]}
    _write_json(out / "generation_config.json", gen)
    tok_files = _write_tokenizer(tok, out, hf_config.get("max_position_embeddings"))
    quantized = [k.rpartition(".")[0] for k in state if k.endswith(".sr_seed")]
    record: dict[str, Any] = {
        "format": "ablate-export/1",
        **(meta or {}),
        "step": run.step if run else None,
        "status": (run.status or "unfinished") if run else None,
        "val_loss": run.val_loss if run else None,
        "checkpoint_format": run.format if run else None,
        "architecture": (hf_config.get("architectures") or [None])[0],
        "source": f"model.hf: {hf_spec}" if hf_spec else "ablate.model.decoder.Transformer",
        "recipe": config.recipe.short(),
        "recipe_table": config.recipe.to_dict(),
        "weights": WEIGHTS_NOTE,
        "quantized_layers": len(quantized),
        "dropped_buffers": list(QUANT_BUFFERS) if quantized else [],
        "forward_quantized": not config.recipe.fprop.high_precision,
        "dtype": dtype,
        "tokenizer": {k: v for k, v in tok.items() if k != "hf"} | {"files": tok_files},
        "departures_from_llama": [] if hf_spec else list(DEPARTURES),
        "rope": None
        if hf_spec
        else "ablate rotates interleaved channel pairs (2i, 2i+1) of each head; the rows of wq "
        "and wk are permuted per head to transformers' halves (i, i + head_dim/2): same function",
        "ablate_version": _version(),
        "code_hash": _code_hash(),
        "run_config": config.to_dict(),
    }
    _write_json(out / METADATA, record)


def check_out(out: Path, force: bool) -> None:
    """``ExportError`` naming ``-o`` unless an export can be written to ``out``: refused when it is
    a file, or holds anything and not ``force``, or holds files an export writes without its
    ``METADATA`` (another model's: ``force`` never replaces those), or cannot be made or written
    (under a file, ``/proc``, a read-only mount: tried with a folder made and removed in the
    nearest part of it that is there)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"-o: {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(
            f"-o: {out} is not empty; nothing was written (pass --force to replace an export "
            "there, or give another folder)"
        )
    theirs = [n for n in FILES if os.path.lexists(out / n)] if out.is_dir() else []
    if theirs and not (out / METADATA).is_file():  # another model's files: --force keeps them
        raise ExportError(
            f"-o: {out} holds {', '.join(theirs)} but no {METADATA}: not an export of ablate, "
            "whose files --force would replace; nothing was written: give another folder"
        )
    here = next(p for p in (out.absolute(), *out.absolute().parents) if os.path.lexists(p))
    if not here.is_dir():
        raise ExportError(f"-o: cannot write {out} ({here} is not a folder); nothing was written")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ablate-export-", dir=here))
    except OSError as e:
        raise ExportError(
            f"-o: cannot write {out} ({e.strerror or e} in {here}); nothing was written"
        ) from None


@contextlib.contextmanager
def _staged(out: Path, force: bool) -> Iterator[Path]:
    """A hidden folder beside ``out`` to write the export into; on success its files replace
    ``out``'s (only the files an export writes), on failure it goes and ``out`` stays as it was.
    Refused as ``check_out`` refuses."""
    check_out(out, force)
    made = [p for p in (out.absolute().parent, *out.absolute().parent.parents) if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.export-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as e:
        _remove_dirs(made)
        raise ExportError(
            f"-o: cannot write {out} ({e.strerror or e}); nothing was written"
        ) from None
    try:
        yield tmp
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_dirs(made)
        raise


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished export in ``tmp`` into ``out``: a rename when ``out`` does not exist,
    otherwise file by file, the replaced files kept aside until every new one is in place."""
    if not out.exists():
        os.replace(tmp, out)
        return
    aside = out.parent / f"{tmp.name}-old"
    aside.mkdir()
    moved: list[str] = []
    try:
        for name in FILES:
            if (out / name).exists():
                os.replace(out / name, aside / name)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
            moved.append(f.name)
    except OSError:
        for name in moved:
            (out / name).unlink(missing_ok=True)
        for f in aside.iterdir():
            os.replace(f, out / f.name)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    tmp.rmdir()


def _remove_dirs(made: list[Path]) -> None:
    """The folders an export created for ``-o``'s parents, innermost first, if still empty."""
    for d in made:
        with contextlib.suppress(OSError):
            d.rmdir()


def _tokenizer(spec: str) -> dict[str, Any]:
    """What the export says of the run's tokenizer (``spec``: ``data.tokenizer``)."""
    from ablate.data import load_tokenizer
    from ablate.data.tokenizer import HFTokenizer, tokenizer_kind

    try:
        kind = tokenizer_kind(spec)
        tok = load_tokenizer(spec)
    except (FileNotFoundError, ImportError, ValueError) as e:
        raise ExportError(
            f"export: {e} (a relative data.tokenizer is read from the current folder: export "
            "from the folder the study ran in)"
        ) from None
    out: dict[str, Any] = {"spec": spec, "kind": kind, "vocab_size": tok.vocab_size}
    out["eos_id"] = tok.eos_id
    if isinstance(tok, HFTokenizer):
        out["hf"] = tok
    else:
        out["ids"] = BYTE_IDS
    return out


def _write_tokenizer(tok: dict[str, Any], out: Path, max_len: int | None) -> list[str]:
    """A Hugging Face tokenizer's ``tokenizer.json`` and a ``tokenizer_config.json`` that
    ``AutoTokenizer.from_pretrained`` reads; nothing for the byte tokenizer."""
    hf = tok.get("hf")
    if hf is None:
        return []
    shutil.copyfile(hf.path, out / "tokenizer.json")
    eos = hf._tok.id_to_token(hf.eos_id)
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": eos,
            "model_max_length": max_len,
            "clean_up_tokenization_spaces": False,
        },
    )
    return ["tokenizer.json", "tokenizer_config.json"]


def _run(study: Study, cell: Cell) -> CellRun | None:
    """The cell's MLflow run, when its store can be read (the export needs it only for a baseline
    seed reused from another study)."""
    try:
        from ablate.tracking import study_status

        for cs in study_status(study):
            if cs.cell.key == cell.key and cs.run is not None:
                return cs.run
    except Exception:  # an unreachable store: the export is still whole without the id
        return None
    return None


def _run_id(run: CellRun | None) -> str | None:
    return None if run is None else str(run.run_id)


def _version() -> str:
    from ablate import __version__

    return __version__


def _code_hash() -> str:
    from ablate.train.provenance import code_hash

    return code_hash()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
