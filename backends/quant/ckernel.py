"""Builds and calls the fused CPU quantize kernel (``csrc/quant.c``) through ctypes.

The kernel is plain C with no Python or torch headers, so it compiles in about a second with the
system C compiler on first use and is cached under ``$ABLATE_CACHE_DIR`` (default
``~/.cache/ablate``), keyed by the source, the compiler flags and the CPU's feature flags (it is built
with ``-march=native``). Without a C compiler (or with ``ABLATE_NO_KERNEL`` on, an on/off switch
of ``backends.env``) ``available()`` is False and ``backends.quant.quantizer`` uses its
pure-torch path of ``torch_path.py``, which gives bit-identical results, slower; a kernel that fails
to build says so once, in a warning.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from backends.env import cache_dir, flag

_SRC = Path(__file__).with_name("csrc") / "quant.c"
# -ffp-contract=off: no fused multiply-adds, so every operation rounds as the torch reference does
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None


class QParams(ctypes.Structure):
    _fields_ = [
        ("outer", ctypes.c_int64),
        ("K", ctypes.c_int64),
        ("inner", ctypes.c_int64),
        ("block", ctypes.c_int32),
        ("in_dtype", ctypes.c_int32),
        ("out_dtype", ctypes.c_int32),
        ("out_kind", ctypes.c_int32),
        ("mbits", ctypes.c_int32),
        ("emin", ctypes.c_int32),
        ("emax", ctypes.c_int32),
        ("maxval", ctypes.c_float),
        ("scale_kind", ctypes.c_int32),
        ("scale_mode", ctypes.c_int32),
        ("global_enc", ctypes.c_float),
        ("global_dec", ctypes.c_float),
        ("global_amax", ctypes.c_float),
        ("tensor_nonfinite", ctypes.c_int32),
        ("global_out", ctypes.c_void_p),  # float[3]: encode, decode, amax (kernel-computed)
        ("prescale", ctypes.c_float),
        ("sr", ctypes.c_int32),
        ("key", ctypes.c_uint32),
        ("nthreads", ctypes.c_int32),
        ("had_g", ctypes.c_int32),
        ("had_norm", ctypes.c_float),
        ("had_signs", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
    ]


class HParams(ctypes.Structure):
    _fields_ = [
        ("outer", ctypes.c_int64),
        ("K", ctypes.c_int64),
        ("inner", ctypes.c_int64),
        ("g", ctypes.c_int32),
        ("in_dtype", ctypes.c_int32),
        ("nthreads", ctypes.c_int32),
        ("norm", ctypes.c_float),
        ("signs", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
    ]


DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return platform.machine() + flags


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    src = _SRC.read_bytes()
    digest = hashlib.sha256(src + " ".join(_FLAGS).encode() + _cpu_signature().encode())
    out = cache_dir() / "kernels" / digest.hexdigest()[:16] / "quant.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        cmd = [cc, *_FLAGS, str(_SRC), "-o", tmp, "-lm"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"compiling {_SRC.name} failed:\n{' '.join(cmd)}\n{res.stderr}")
        os.replace(tmp, out)  # atomic: concurrent workers may build at the same time
    lib = ctypes.CDLL(str(out))
    lib.ablate_quantize.argtypes = [ctypes.POINTER(QParams)]
    lib.ablate_quantize.restype = ctypes.c_int
    lib.ablate_hadamard.argtypes = [ctypes.POINTER(HParams)]
    lib.ablate_hadamard.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel, building it on first use; None (with one warning) if it cannot be built."""
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            if flag("ABLATE_NO_KERNEL", False):
                _failed = "disabled by ABLATE_NO_KERNEL"
                return None
            try:
                _lib = _build()
            except (RuntimeError, OSError) as e:
                _failed = str(e)
                warnings.warn(
                    f"ablate: the fused CPU quantizer is unavailable ({e}); using the pure-torch "
                    "quantizer (identical numerics, slower)",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _lib


def check_env() -> None:
    """Raise ``ValueError`` if ``ABLATE_NO_KERNEL`` (on: use the pure-torch quantizer, not the
    kernel) is set to a value an on/off switch does not allow (``backends.env.flag``)."""
    flag("ABLATE_NO_KERNEL", False)


def available() -> bool:
    return library() is not None


def usable(x: torch.Tensor) -> bool:
    """Whether the kernel can take ``x``: a CPU tensor of a supported dtype, kernel built, and not
    inside ``torch.compile`` (a compiled model traces the torch path of ``torch_path.py`` instead, which
    computes the same bits and which a graph can hold; the kernel's pointers and ctypes cannot)."""
    return (
        x.device.type == "cpu"
        and x.dtype in DTYPE_CODES
        and not torch.compiler.is_compiling()
        and available()
    )


def run(params: QParams) -> None:
    lib = library()
    assert lib is not None
    rc = lib.ablate_quantize(ctypes.byref(params))
    if rc != 0:
        raise ValueError(f"quantize kernel rejected its arguments (block={params.block})")


def run_hadamard(params: HParams) -> None:
    lib = library()
    assert lib is not None
    rc = lib.ablate_hadamard(ctypes.byref(params))
    if rc != 0:
        raise ValueError(f"hadamard kernel rejected its arguments (g={params.g}, K={params.K})")


def layout(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, int, str]:
    """A C-contiguous tensor holding ``x`` for a kernel working along ``axis``, the axis in it, and
    how to map the kernel's output back: "moved" (axis last; ``movedim(-1, axis)``), "t" (2-D
    transpose; ``.t()``) or "" (same layout)."""
    nd = x.dim()
    moved = x.movedim(axis, -1)
    if axis != nd - 1 and moved.is_contiguous():
        return moved, nd - 1, "moved"  # e.g. a Hadamard output along axis 0
    if not x.is_contiguous() and nd == 2 and x.t().is_contiguous():
        return x.t(), 1 - axis, "t"  # e.g. dY^T of the Wgrad GEMM
    return x.contiguous(), axis, ""


def restore(out: torch.Tensor, axis: int, how: str) -> torch.Tensor:
    """Inverse of ``layout`` for a kernel output shaped like the base tensor."""
    if how == "moved":
        return out.movedim(-1, axis)
    if how == "t":
        return out.t()
    return out
