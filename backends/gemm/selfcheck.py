"""The native GEMMs' start-up self-check: before a cell trains with ``backend: native``, every GEMM
of its recipe runs once on its device and is compared with the ``emulated`` backend.

Why: a scaled GEMM reads codes and scales in a layout the library version decides (cuBLAS's
swizzled 128x4 tiles, ROCm's row-major or pre-swizzled scales), and a layout read wrongly does not
fail, it multiplies by the wrong scales (``torch._scaled_mm`` tells two scale layouts apart by the
element count alone, equal for most LLM shapes). The emulation is exact by construction (tested
against the OCP MX rules, torchao and TransformerEngine), so the hardware is held to it.

What one check runs, per distinct GEMM of the recipe (its two operand formats and its Hadamard
transform) and per shape class (``SHAPES``: aligned, and ragged in every dimension), on operands
seeded by ``SEED`` whose first rows hold the edge blocks (``edge_operand``: an all-zero block, the
smallest scales, values past the format's largest, a ragged K), and once more with a NaN in one
operand:

- the native product (``NativeBackend.mm``) against the emulated one (``EmulatedBackend.mm``) on
  the same codes and scales: the same NaN and infinity positions, and every finite element within
  ``bound``, the error FP32 accumulation in another order may make, ``2 K u (|A| |B|^T)`` with
  ``u = 2^-24`` over the decoded operands, plus half a BF16 ulp of the result where the GEMM writes
  BF16 (MXFP4 on CUDA), plus ``2^-8 (|A| |B|^T)`` where the tensor cores accumulate in fixed
  point (FP8 on Ada and Hopper: ``accumulation_bits``);
- a failure raises ``NativeCheckError`` naming the device, torch and CUDA/ROCm versions, the
  format, the GEMM, the shape and the first differing element, before any training step.

A pass is cached (``native_check.json`` in ``ABLATE_CACHE_DIR``, default ``~/.cache/ablate``) per
device, torch, CUDA/ROCm, this check's and the native backend's code, and the GEMMs checked: it
costs its seconds once per machine. The cache is untrusted: an entry is read only as the pass it
records, anything else in the file is ignored, and a damaged file is rewritten. ``ABLATE_NATIVE_CHECK``
off (``0``, ``false``, ``no``, ``off``) skips the check: a run then records ``skipped:
ABLATE_NATIVE_CHECK=`` and the value as set. ``ablate native-check`` runs it for every format a
device has, and ``make gpu-check`` as a stage.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from backends.env import cache_dir, flag, text
from backends.gemm.base import GemmKeys, UnsupportedFormatError
from backends.gemm.capabilities import device_arch, device_name, supported_formats
from backends.gemm.emulated import EmulatedBackend
from backends.gemm.native import NativeBackend, dequantize_packed, pack_operand
from backends.quant.rotation import DETERMINISTIC
from backends.recipes import GEMMS, GemmRecipe, Recipe

CHECK_VERSION = 2
"""Bumped when what the check compares changes (old cached passes no longer count)."""
SEED = 20261126
SHAPES = {"aligned": (64, 48, 256), "ragged": (37, 19, 112)}
"""Shape classes (M, N, K) of ``a`` (M, K) x ``b`` (N, K)^T: aligned to every block and tile,
and ragged (no row count a multiple of 16, K of 32): the padding the GEMMs need."""
U = 2.0**-24
KEYS = GemmKeys(a=11, b=12, signs=13)
_lock = threading.Lock()
_done: dict[str, str] = {}  # this process's results, by cache key


class NativeCheckError(UnsupportedFormatError):
    """The device's native GEMM does not compute what the emulation computes."""


@dataclass(frozen=True, slots=True)
class Case:
    """One GEMM of a recipe as the check runs it."""

    gemm: str
    """fprop, dgrad or wgrad (the first of the recipe's GEMMs with this ``recipe``)."""
    recipe: GemmRecipe

    @property
    def name(self) -> str:
        return f"{self.gemm} {self.recipe.short()}"


def cases(recipe: Recipe) -> list[Case]:
    """The distinct quantized GEMMs of ``recipe`` (two GEMMs with the same operand formats and
    transform are one case)."""
    seen: dict[str, Case] = {}
    for g in GEMMS:
        gr = recipe.gemm(g)
        if gr.high_precision or gr.a is None or gr.b is None:
            continue
        seen.setdefault(gr.short(), Case(g, gr))
    return list(seen.values())


def edge_operand(
    rows: int, K: int, generator: torch.Generator, nan: bool = False, per_tensor: bool = False
) -> torch.Tensor:
    """(rows, K) float32 seeded normal values whose first rows are edge cases: row 0 starts with
    an all-zero 32-element block, row 1 holds values near 2^-120 (the smallest scales), row 2
    values 2^20 times the rest (past every block format's largest: saturation). ``per_tensor``
    (one scale for the tensor, set by its largest value): row 2 only 8 times the rest, so that
    the other rows keep their codes. ``nan``: one NaN in row 3. Any K: a ragged one pads the last
    block."""
    x = torch.randn(rows, K, generator=generator)
    x[0, : min(32, K)] = 0.0
    if rows > 1:
        x[1] *= 2.0**-120
    if rows > 2:
        x[2] *= 8.0 if per_tensor else 2.0**20
    if nan and rows > 3:
        x[3, K // 2] = float("nan")
    return x


FIXED_POINT_FP8 = ("sm_89", "sm_90")
"""Devices whose FP8 tensor cores add products in fixed point (Ada, Hopper)."""


def accumulation_bits(fmt: str, arch: str | None) -> int:
    """The relative precision (bits, of the sum of magnitudes) with which the native GEMM of
    ``fmt`` accumulates on ``arch``: 24 (FP32) except FP8 on Ada and Hopper, whose tensor cores
    add products in fixed point, keeping about 14 bits below the largest exponent (DeepSeek-V3
    report, 3.5.2), while cuBLAS promotes the partial sums to FP32 every few k-steps: a
    32-product chunk can lose 32 * 2^-13 of its largest product, 2^-8 of the chunk's sum of
    magnitudes. Measured on an H200 (torch 2.11, CUDA 13.0): 0.0046 on an output of 6.08 whose
    sum of magnitudes is about 140, where FP32 order allows 0.004."""
    return 8 if fmt.startswith("fp8") and arch in FIXED_POINT_FP8 else 24


def bound(
    a_abs: torch.Tensor, b_abs: torch.Tensor, K: int, bf16_out: bool, acc_bits: int = 24
) -> torch.Tensor:
    """The largest difference FP32 accumulation in another order (and a BF16 output, and a
    tensor core that accumulates with ``acc_bits``: ``accumulation_bits``) may make, per output
    element, from the decoded operands' magnitudes (float64)."""
    mag = a_abs.double() @ b_abs.double().t()
    out = 2 * K * U * mag
    if acc_bits < 24:
        out = out + 2.0**-acc_bits * mag
    if bf16_out:
        out = out + 2.0**-9 * mag
    return out + 2.0**-149  # a difference in the smallest subnormal


def _signs(case: Case, device: torch.device) -> torch.Tensor | None:
    h = case.recipe.hadamard
    if h is None or h.signs == DETERMINISTIC:
        return None
    if h.signs == "fixed" and h.vector is not None:
        return torch.tensor(h.vector, dtype=torch.float32, device=device)
    g = torch.Generator().manual_seed(SEED + 1)
    return (torch.randint(0, 2, (h.size,), generator=g) * 2 - 1).float().to(device)


def compare(
    case: Case, shape: str, device: torch.device, native: NativeBackend, nan: bool = False
) -> str | None:
    """None when the native GEMM of ``case`` equals the emulated one on the ``shape`` class (and
    with a NaN in ``a`` where ``nan``), else what differs first."""
    M, N, K = SHAPES[shape]
    g = torch.Generator().manual_seed(SEED + (7 if nan else 0))
    gr = case.recipe
    assert gr.a is not None and gr.b is not None
    a = edge_operand(M, K, g, nan=nan, per_tensor=gr.a.fmt.scale == "tensor").to(device)
    b = edge_operand(N, K, g, per_tensor=gr.b.fmt.scale == "tensor").to(device)
    signs = _signs(case, device)
    out_n = native.mm(a, b, gr, KEYS, signs).float()
    out_e = EmulatedBackend().mm(a, b, gr, KEYS, signs).float()
    where = f"{case.name}, {shape} (M, N, K) = ({M}, {N}, {K}){' with a NaN in a' if nan else ''}"
    if out_n.shape != out_e.shape:
        return f"{where}: native output {tuple(out_n.shape)}, emulated {tuple(out_e.shape)}"
    for what, fn in (("NaN", torch.isnan), ("infinity", torch.isinf)):
        diff = fn(out_n) != fn(out_e)
        if bool(diff.any()):
            i, j = (int(v) for v in diff.nonzero()[0])
            return (
                f"{where}: a {what} at [{i}, {j}] in one output and not the other (native "
                f"{out_n[i, j].item()!r}, emulated {out_e[i, j].item()!r})"
            )
    rot = gr.rotation(signs)
    pa = pack_operand(torch.nan_to_num(a, nan=0.0), gr.a, key=KEYS.a, hadamard=rot)
    pb = pack_operand(b, gr.b, key=KEYS.b, hadamard=rot)
    a_abs = dequantize_packed(pa).abs().nan_to_num(0.0)
    b_abs = dequantize_packed(pb).abs().nan_to_num(0.0)
    bf16 = pa.out_dtype == torch.bfloat16
    acc = accumulation_bits(pa.spec.format, device_arch(device))
    tol = bound(a_abs, b_abs, pa.data.shape[1] * (2 if pa.spec.fmt.is_fp4 else 1), bf16, acc)
    tol = tol[:M, :N] * abs(gr.output_scale)
    finite = torch.isfinite(out_e) & torch.isfinite(out_n)
    err = ((out_n.double() - out_e.double()).abs() - tol.to(out_n.device)).where(finite, -1.0)
    if bool((err > 0).any()):
        i, j = (int(v) for v in (err > 0).nonzero()[0])
        return (
            f"{where}: first difference at [{i}, {j}]: native {out_n[i, j].item()!r}, emulated "
            f"{out_e[i, j].item()!r}, allowed {tol[i, j].item():.3g} (FP32 accumulation order)"
        )
    return None


def versions(device: torch.device) -> str:
    """The device and the library versions a result holds for (named in every message)."""
    parts = [device_name(device), f"torch {torch.__version__}"]
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    if getattr(torch.version, "hip", None):
        parts.append(f"ROCm {torch.version.hip}")
    return ", ".join(parts)


@functools.cache
def _code_hash() -> str:
    h = hashlib.sha256()
    for mod in ("native.py", "layouts.py", "selfcheck.py", "capabilities.py"):
        h.update((Path(__file__).parent / mod).read_bytes())
    return h.hexdigest()[:16]


def cache_key(device: torch.device, checked: Iterable[Case]) -> str:
    what = [versions(device), str(CHECK_VERSION), _code_hash(), *sorted(c.name for c in checked)]
    return hashlib.sha256("\n".join(what).encode()).hexdigest()[:24]


def cache_path() -> Path:
    return cache_dir() / "native_check.json"


def _read_cache(path: Path) -> dict[str, dict[str, str]]:
    """The cached passes, from an untrusted file: entries that are not a pass are dropped, and a
    file that is not such JSON reads as empty (and is rewritten by the next pass)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("version") != CHECK_VERSION:
        return {}
    entries = raw.get("passes")
    if not isinstance(entries, dict):
        return {}
    return {
        k: v
        for k, v in entries.items()
        if isinstance(k, str)
        and isinstance(v, dict)
        and v.get("result") == "passed"
        and all(isinstance(x, str) for x in v.values())
    }


def _write_cache(path: Path, key: str, entry: dict[str, str]) -> None:
    entries = _read_cache(path)
    entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": CHECK_VERSION, "passes": entries}, indent=1) + "\n")
    os.replace(tmp, path)


def check_env() -> None:
    """Raise ``ValueError`` if ``ABLATE_NATIVE_CHECK`` is set to a value it does not allow (an
    on/off switch, ``backends.env.flag``: off skips the check, on runs it)."""
    flag("ABLATE_NATIVE_CHECK", True)


def self_check(
    recipe: Recipe,
    device: torch.device | str,
    native: NativeBackend | None = None,
    *,
    use_cache: bool = True,
    log: Callable[[str], object] | None = None,
) -> str:
    """Check every GEMM of ``recipe`` on ``device``'s native GEMM against the emulation (module
    docstring); returns what a run records (``passed: ...``, ``passed (cached ...): ...`` or
    ``skipped: ...``), or raises ``NativeCheckError``."""
    device = torch.device(device)
    todo = cases(recipe)
    if not todo:
        return "nothing to check: no GEMM is quantized"
    if not flag("ABLATE_NATIVE_CHECK", True):  # the value as set: 0, false, no or off, any case
        return f"skipped: ABLATE_NATIVE_CHECK={text('ABLATE_NATIVE_CHECK', '')}"
    names = ", ".join(c.name for c in todo)
    key = cache_key(device, todo)
    with _lock:
        if key in _done:
            return _done[key]
        path = cache_path()
        if use_cache:
            hit = _read_cache(path).get(key)
            if hit is not None:
                _done[key] = f"passed (cached {hit.get('when', '?')}): {names}"
                return _done[key]
        native = native or NativeBackend()
        for case in todo:
            for shape in SHAPES:
                for nan in (False, True):
                    if nan and shape != "aligned":
                        continue
                    try:
                        problem = compare(case, shape, device, native, nan=nan)
                    except Exception as e:  # noqa: BLE001 - a GEMM that raises fails the check
                        problem = f"{case.name}, {shape}: the GEMM raised {type(e).__name__}: {e}"
                    if problem is not None:
                        raise NativeCheckError(
                            f"backend native: the native GEMM on {versions(device)} does not "
                            f"compute what the emulation does: {problem}. Nothing was trained; "
                            "run the recipe with `backend: emulated`, or report the device and "
                            "versions above"
                        )
            if log is not None:
                log(f"native check: {case.name}: equal to the emulation")
        when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        result = f"passed: {names}"
        if use_cache:
            with contextlib.suppress(OSError):  # a read-only cache: the check runs next time too
                _write_cache(path, key, {"result": "passed", "when": when, "what": names})
        _done[key] = result
        return result


def format_recipes(formats: Iterable[str]) -> dict[str, Recipe]:
    """One recipe per family of ``formats`` whose GEMMs use it (FP8 and MXFP8 as their training
    recipes do: E4M3 forward, E5M2 x E4M3 backward), by its short name."""
    out: dict[str, Recipe] = {}
    for f in formats:
        if f.startswith("fp8"):
            r = Recipe.from_shorthand([], base="fp8")
        elif f.startswith("mxfp8"):
            r = Recipe.from_shorthand([], base="mxfp8")
        else:
            r = Recipe.from_shorthand(list(GEMMS), fp4_format=f)
        out.setdefault(r.short(), r)
    return out


def not_native(device: torch.device | str, formats: Iterable[str]) -> list[str]:
    """The formats of ``formats`` whose GEMMs (their ``format_recipes`` recipe) ``device`` has no
    native GEMM for: what ``check_device`` could only report as ``FAILED: not native here``."""
    device = torch.device(device)
    native = NativeBackend()
    return [
        f
        for f in formats
        if any(_why_not_native(r, device, native) for r in format_recipes([f]).values())
    ]


def _why_not_native(recipe: Recipe, device: torch.device, native: NativeBackend) -> str | None:
    """Why ``device`` has no native GEMM for ``recipe`` (``native.check``, what ``convert_model``
    asks first), or None when it has."""
    try:
        native.check(recipe, device)
    except UnsupportedFormatError as e:
        return str(e)
    return None


def check_device(
    device: torch.device | str,
    formats: Iterable[str] | None = None,
    *,
    use_cache: bool = True,
    log: Callable[[str], object] | None = None,
) -> dict[str, str]:
    """``self_check`` of every format ``device`` runs natively (or ``formats``), one recipe per
    family (``format_recipes``): recipe name -> its result, ``FAILED: <why>`` for a failure."""
    device = torch.device(device)
    fmts = sorted(supported_formats(device) if formats is None else formats)
    results: dict[str, str] = {}
    for name, recipe in format_recipes(fmts).items():
        native = NativeBackend()
        why = _why_not_native(recipe, device, native)
        if why is not None:
            results[name] = f"FAILED: not native here: {why}"
            continue
        try:
            results[name] = self_check(recipe, device, native, use_cache=use_cache, log=log)
        except UnsupportedFormatError as e:
            results[name] = f"FAILED: {e}"
    return results


def forget() -> None:
    """Forget this process's results (tests)."""
    with _lock:
        _done.clear()


__all__ = [
    "CHECK_VERSION",
    "Case",
    "NativeCheckError",
    "SHAPES",
    "bound",
    "cache_path",
    "cases",
    "check_device",
    "check_env",
    "compare",
    "edge_operand",
    "forget",
    "format_recipes",
    "not_native",
    "self_check",
    "versions",
]
