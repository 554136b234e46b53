"""Every check ``ablate run`` makes before it writes anything (``preflight``), which ``validate``,
``plan`` and ``tune`` make too: the ``ABLATE_*`` switches hold values they allow
(``check_environment``); the tracking store is usable; cells that need a GPU get one
(``check_gpus``); a Ray task's ``cuda:N`` exists in it (``check_ray_devices``); and, unless a
cluster's workers decide, this machine's device runs every cell's recipe (``check_devices``) and has
the cores and GPUs a cell asks for (``check_resources``) and the memory a cell's estimate needs
(``check_memory``); what the Hugging Face hub must give can be had (``check_hub``). Each raises
``CannotRunError`` naming the cells, the fields and the fix.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Iterable

from ablate.driver.reuse import check_source
from ablate.errors import CannotRunError, RunnerError, TrackingError
from ablate.executor import ExecutorName, cluster_address, remote_cluster
from ablate.executor.devices import cuda_index
from ablate.study import Cell, Study
from ablate.tracking import check_cluster_uri, check_store
from ablate.train.config import device_kind


def check_environment() -> None:
    """The ``ABLATE_*`` switches with a closed set of values (``backends.env``; and
    ``ABLATE_COMPILE_BACKEND``, one of torch's compile backends) hold one of them in this process,
    as each switch's reader checks it; raises ``CannotRunError`` naming the first that does not and
    what it allows. A Ray cluster's workers have their own environment: a bad
    value there fails the cell that reads it."""
    from backends.gemm import emulated, selfcheck
    from backends.quant import ckernel, ops, torch_path

    try:
        for reader in (emulated, torch_path, ops, ckernel, selfcheck):
            reader.check_env()
    except ValueError as e:
        raise CannotRunError(str(e)) from None


def check_devices(study: Study, cells: Iterable[Cell] | None = None) -> None:
    """Ask each cell's GEMM backend whether this machine's device can run its recipe and its
    phases' (before any cell starts); raises ``CannotRunError`` listing every refusal. On a Ray cluster (``--address``)
    the workers' devices are not this machine's, so the check then runs in the workers."""
    from ablate.train.device import resolve_device
    from backends.gemm import UnsupportedFormatError, get_backend

    problems: dict[str, list[str]] = {}
    for c in study.cells if cells is None else cells:
        for phase, recipe in [("", c.config.recipe)] + [
            (f"{p.name or 'phase'}: ", p.recipe) for p in c.config.phases
        ]:  # a precision schedule's phases too (their names say which)
            try:
                get_backend(c.config.backend).check(recipe, resolve_device(c.config.device))
            except (UnsupportedFormatError, ValueError) as e:
                problems.setdefault(phase + str(e), []).append(c.label)
    if problems:
        lines = [
            f"  cells {', '.join(labels[:4])}{' ...' if len(labels) > 4 else ''}:\n"
            + textwrap.indent(msg, "    ")
            for msg, labels in problems.items()
        ]
        raise CannotRunError("this machine cannot run the study:\n" + "\n".join(lines))


def check_resources(study: Study, *, num_cpus: int | None = None) -> None:
    """On this machine (no cluster), a cell's ``resources`` must fit it: Ray would otherwise queue
    the cells forever. On a cluster the executor checks its nodes once Ray is up."""
    import torch

    res = study.file.resources
    cpus = num_cpus or os.cpu_count() or 1
    gpus = torch.cuda.device_count()
    problems = []
    n = res.workers
    per = f" per worker x resources.workers {n}" if n > 1 else " per cell"
    if res.cpus * n > cpus:
        problems.append(f"resources.cpus: {res.cpus:g}{per}, but this machine has {cpus}")
    if res.gpus * n > gpus:
        problems.append(f"resources.gpus: {res.gpus:g}{per}, but this machine has {gpus}")
    if problems:
        raise CannotRunError(
            "this machine cannot run the study: "
            + "; ".join(problems)
            + " (lower them, or run on a cluster with --address)"
        )


def check_hub(study: Study) -> None:
    """What ``run`` fetches from the Hugging Face hub, refused at once, naming its field, when the
    hub cannot be reached from here and no cache holds it: a hub tokenizer (``data.tokenizer``),
    fetched before anything starts, and a hub dataset (``data.hf_dataset``,
    ``data.val.hf_dataset``) not yet prepared in the data cache (``preparing.check_hub_data``)."""
    from ablate.data import load_tokenizer
    from ablate.data.tokenizer import hub_unreachable, tokenizer_kind

    for spec in sorted({c.config.data.tokenizer for c in study.cells}):
        try:
            if tokenizer_kind(spec) != "hub":
                continue
            load_tokenizer(spec, offline=True)
        except FileNotFoundError:
            if (why := hub_unreachable()) is not None:
                raise CannotRunError(
                    f"data.tokenizer: {spec!r} is not in the Hugging Face cache and the hub "
                    f"cannot be reached ({why}); give the path of its tokenizer.json, or run "
                    "where the hub answers"
                ) from None
        except (ValueError, ImportError):
            continue  # refused with its field by the study's own checks
    from ablate.driver.preparing import check_hub_data

    check_hub_data(study)


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(study: Study) -> None:
    """On this machine (no cluster), each cell's memory estimate (``ablate plan`` shows it) must fit
    the memory of the device it trains on: a CPU cell this machine's memory, a GPU cell the GPU's.
    Refused before anything is allocated, naming the cells and the shape fields."""
    from ablate.train.memory import estimate_run, format_bytes, visible_device_memory

    over: dict[tuple[str, int, int], list[str]] = {}
    limits = {"cpu": machine_memory(), "cuda": visible_device_memory()}
    for cell in study.cells:
        kind = device_kind(cell.config.device)
        limit = limits.get(kind)
        if limit is None:
            continue
        try:
            need = estimate_run(cell.config, kind).total
        except ValueError:  # a config the estimate cannot resolve fails in its cell, named there
            continue
        if need > limit:
            over.setdefault((kind, need, limit), []).append(cell.label)
    if over:
        parts = [
            f"{_cells(labels)} need{'s' if len(labels) == 1 else ''} about {format_bytes(need)} "
            f"per {kind} device by the estimate, "
            f"and this machine's {kind} has {format_bytes(limit)}"
            for (kind, need, limit), labels in over.items()
        ]
        raise CannotRunError(
            "this machine cannot run the study: "
            + "; ".join(parts)
            + " (shrink model.dim, model.n_layers, model.head_dim, train.batch_size or "
            "train.seq_len, checkpoint activations with train.recompute, or run on a larger "
            "machine or a cluster with --address; `ablate plan` shows the estimate)"
        )


def _device(study: Study, cell: Cell) -> str:
    """The device a cell's study asked for (``auto`` included), before expansion resolved it."""
    return str(cell.values.get("device", study.file.base.device))


def needs_gpu(study: Study, cell: Cell) -> str:
    """Why a cell needs a GPU wherever it runs ("" when it does not): its device is CUDA
    (``cuda``, ``cuda:N``, or ``auto`` resolved with ``resources.gpus > 0``), or its backend is
    native and its device ``auto`` (native FP4/FP8 GEMMs exist only on GPUs; a native cell with
    ``device: cpu`` is the backend's to refuse, recipe by recipe)."""
    written = _device(study, cell)
    if device_kind(cell.config.device) == "cuda":
        return f"device: {cell.config.device if written == 'auto' else written}"
    if cell.config.backend == "native" and written == "auto":
        return "backend: native"
    return ""


_WHY_GPU = {
    "device": "to train on a GPU",
    "backend": "to run native FP4/FP8 GEMMs, which exist only on GPUs",
}


def check_gpus(study: Study, *, gpus_seen: float = 0, where: str = "this machine") -> None:
    """Refuse cells that need a GPU when ``resources.gpus`` gives them none (a Ray task that asks
    for no GPU sees none: it would train on the CPU in fp32, or fail in every worker). Cells that
    need one wherever they run (``needs_gpu``) are refused from the study alone; ``device: auto``
    cells (pinned to cpu at expansion when ``resources.gpus`` is 0) when ``where`` has
    ``gpus_seen`` GPUs: a GPU study that forgot ``resources.gpus`` must not silently train on CPUs,
    and a CPU study says ``device: cpu``. Raises ``CannotRunError`` naming the cells and the fix."""
    res = study.file.resources
    if res.gpus > 0:
        return
    reasons: dict[str, list[str]] = {}
    for c in study.cells:
        why = needs_gpu(study, c)
        if not why and gpus_seen and _device(study, c) == "auto":
            why = "device: auto"
        if why:
            reasons.setdefault(why, []).append(c.label)
    if not reasons:
        return
    lines = []
    for why, labels in reasons.items():
        need = _WHY_GPU.get(why.partition(":")[0], "")
        if why == "device: auto":
            need = (
                f"{where} has {gpus_seen:g} GPU(s), but with resources.gpus: 0 auto resolves to "
                "cpu and these cells would train on the CPU in fp32"
            )
        lines.append(f"  {why} ({_cells(labels)}): {need}")
    alternatives = (
        ["device: cpu to train on CPUs on purpose"]
        if any(w.startswith("device") for w in reasons)
        else []
    )
    if "backend: native" in reasons:
        alternatives.append("backend: emulated to emulate the formats on CPUs")
    raise CannotRunError(
        "resources.gpus: 0 gives each cell no GPU (a Ray task that asks for none sees none), but "
        f"{sum(map(len, reasons.values()))} cell(s) need one:\n"
        + "\n".join(lines)
        + "\nfix: set resources.gpus: 1 (GPUs per cell), or "
        + ", or ".join(alternatives)
    )


def auto_cpu_cells(study: Study) -> list[str]:
    """Labels of the cells that ``device: auto`` pinned to cpu (``resources.gpus`` 0): what a
    cluster with GPUs refuses (``check_gpus``), which ``validate --address`` cannot see."""
    if study.file.resources.gpus > 0:
        return []
    return [c.label for c in study.cells if _device(study, c) == "auto" and not needs_gpu(study, c)]


def check_ray_devices(study: Study) -> None:
    """A Ray task sees only the GPUs it asks for, numbered from 0: ``cuda:N`` needs N <
    ``resources.gpus`` (rounded up)."""
    seen = math.ceil(study.file.resources.gpus)
    bad: dict[str, list[str]] = {}
    for c in study.cells:
        index = cuda_index(c.config.device)
        if index is not None and index >= max(seen, 1):  # gpus 0: check_gpus refuses them
            bad.setdefault(c.config.device, []).append(c.label)
    if bad:
        lines = [f"  device: {d} ({_cells(labels)})" for d, labels in bad.items()]
        raise CannotRunError(
            f"a Ray task sees only the resources.gpus: {study.file.resources.gpus:g} GPU(s) it "
            "asks for, numbered from 0 (Ray sets CUDA_VISIBLE_DEVICES), so these devices do not "
            "exist in it:\n"
            + "\n".join(lines)
            + "\nfix: use device: cuda (the cell's first GPU), or raise resources.gpus"
        )


def _cells(labels: list[str]) -> str:
    more = f" and {len(labels) - 4} more" if len(labels) > 4 else ""
    return f"cell{'s' if len(labels) > 1 else ''} {', '.join(labels[:4])}{more}"


def check_baseline_source(study: Study) -> None:
    """``CannotRunError`` when the store ``baseline_from`` names is unusable (checked as the
    study's own store is), or it or the study in it cannot be read (read only)."""
    try:
        check_source(study)
    except CannotRunError:  # its store unusable: said as for the study's own
        raise
    except RunnerError as e:
        raise CannotRunError(f"{e} (run that study first, or drop baseline_from)") from None


def preflight(
    study: Study,
    *,
    executor: ExecutorName = "ray",
    address: str | None = None,
    num_cpus: int | None = None,
    memory: bool = True,
) -> None:
    """Every check ``run`` makes before it writes anything: the ``ABLATE_*`` switches hold values
    they allow (``check_environment``); the tracking store is usable; cells that need a GPU get
    one (``check_gpus``: from the study alone, and for ``device: auto`` from this machine's GPUs
    unless a cluster runs the study; the executor checks the cluster's); and (unless a cluster's
    workers decide) this machine's device runs every cell's recipe and has the resources a cell
    asks for. ``validate``, ``plan``, ``run`` and ``tune`` all call it."""
    import torch

    check_environment()
    try:
        check_store(study.tracking_uri)
    except TrackingError as e:
        raise CannotRunError(str(e)) from None
    check_baseline_source(study)
    workers = study.file.resources.workers
    if executor == "local" and workers > 1:
        raise CannotRunError(
            f"resources.workers: {workers} workers per cell run through Ray Train; the local "
            "executor runs one process (use the ray executor, or resources.workers: 1)"
        )
    on_cluster = executor == "ray" and bool(cluster_address(address))
    check_gpus(study, gpus_seen=0 if on_cluster else torch.cuda.device_count())
    if executor == "ray":
        check_ray_devices(study)
    if not on_cluster:
        check_devices(study)
        check_resources(study, num_cpus=num_cpus)
        if memory:  # ``plan`` shows the estimates and warns instead
            check_memory(study)
    if executor == "ray" and remote_cluster(address):
        try:
            check_cluster_uri(study.tracking_uri, str(cluster_address(address)))
        except TrackingError as e:
            raise CannotRunError(str(e)) from None
    check_hub(study)  # last: the driver fetches a hub tokenizer, on a cluster too
