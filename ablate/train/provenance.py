"""What produced a result: the code, the software and the device a run trained with.

``environment(config)`` is recorded with every cell's run (as ``env.*`` tags, by the executor), so
a number in a report can be traced to the code, device and precision that produced it:

    ablate_version  the installed distribution's version
    git_commit      the commit of the source tree ablate runs from ("unknown" outside a checkout)
    git_dirty       whether that tree had uncommitted changes to ablate/ or backends/
    numerics        the numerics version (``ablate.numerics``): the same number, the same numerics
                    on one machine kind; a bump means the numbers moved
    code_hash       a hash of the code that computes the numbers (backends/, ablate/model/,
                    ablate/data/ and ablate/train/,
                    Python and C sources, less the benchmarks and the probes, which change no
                    number of a run: ``NOT_NUMERICS``): equal hashes, equal numerics. ``ablate plan`` marks a
                    finished cell whose hash differs from the current one as stale
    torch, python   versions; cuda the CUDA runtime torch was built with (GPU runs)
    device          the device kind (cpu, cuda) and device_name (GPU name, or CPU model with the
                    vector kernels torch runs on it: ATen's capability, which decides last bits)
    precision       the resolved autocast precision (bf16, fp32)
    backend         the GEMM backend
    native_check    with ``backend: native``: the native GEMMs' self-check against the emulation
                    (``backends.gemm.selfcheck``): ``passed: <the GEMMs>``, ``passed (cached
                    <when>): ...`` or ``skipped: ...``; a failed check refuses the cell instead

The code hash is computed once per process (a few ms of reading files).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from ablate.numerics import NUMERICS_VERSION
from ablate.train.config import RunConfig, device_kind, resolved_compile, resolved_precision
from backends.gemm.capabilities import device_description

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding ablate/ and backends/
_NUMERICS = ("backends", "ablate/model", "ablate/data", "ablate/train")
NOT_NUMERICS = frozenset(
    {"backends/layer/probe.py", "ablate/train/probe.py", "backends/gemm/selfcheck.py"}
)
"""Sources under ``_NUMERICS`` that compute no number of a run (a run is bit-identical with probes
on or off; the native GEMMs' self-check decides whether a cell starts, and its products are thrown
away): a change to them marks no result stale. The benchmarks live in ``ablate/bench/``."""


@functools.cache
def code_hash() -> str:
    """sha256 (16 hex digits) of the sources that compute a run's numbers, by relative path."""
    h = hashlib.sha256()
    for top in _NUMERICS:
        for path in sorted((_ROOT / top).rglob("*")):
            rel = path.relative_to(_ROOT).as_posix()
            if (
                path.suffix in (".py", ".c", ".h")
                and "__pycache__" not in path.parts
                and rel not in NOT_NUMERICS
            ):
                h.update(rel.encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def git_state() -> tuple[str, str]:
    """(commit, dirty) of the checkout ablate runs from, or ("unknown", "unknown")."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10
        )
        if out.returncode:
            raise OSError(out.stderr.strip())
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "ablate", "backends"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", "unknown"
    return commit, str(dirty).lower()


def _version() -> str:
    try:
        return metadata.version("ablate")
    except metadata.PackageNotFoundError:
        return "unknown"


def device_name(kind: str) -> str:
    """The GPU's name (with its architecture) on CUDA; otherwise the CPU's model name with the
    vector kernels torch runs on it (ATen's CPU capability, e.g. ``AMD EPYC (AVX512)``): one CPU
    under two capabilities (``ATEN_CPU_CAPABILITY``) trains other last bits."""
    cuda = kind == "cuda" and torch.cuda.is_available()
    name = device_description(torch.device("cuda" if cuda else "cpu"))
    return name if cuda else f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def environment(config: RunConfig) -> dict[str, str]:
    """The provenance of a run of ``config`` in this process (module docstring)."""
    kind = device_kind(config.device)
    commit, dirty = git_state()
    env = {
        "ablate_version": _version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "numerics": str(NUMERICS_VERSION),
        "code_hash": code_hash(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": kind,
        "device_name": device_name(kind),
        "precision": resolved_precision(config.train.precision, kind),
        "compiled": "true" if resolved_compile(config.train.compile, kind) else "false",
        "backend": config.backend,
    }
    if kind == "cuda" and torch.version.cuda:
        env["cuda"] = str(torch.version.cuda)
    if config.backend == "native":  # run (or found cached) once per process and machine
        from backends.gemm.selfcheck import self_check

        device = kind if config.device == "auto" else config.device
        env["native_check"] = self_check(config.recipe, torch.device(device))
    return env
