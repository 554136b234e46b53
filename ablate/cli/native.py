"""``ablate native-check``: the native GEMMs' self-check on this machine, for every format its
device runs (``backends.gemm.selfcheck``), as a cell with ``backend: native`` runs it before it
trains; a new machine checked before a study spends its GPU-hours."""

from __future__ import annotations

import json

import click


@click.command("native-check")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--format",
    "formats",
    multiple=True,
    help="A format to check (repeatable; default: every format the device runs natively; one it "
    "does not run natively is refused, exit 2).",
)
@click.option("--no-cache", is_flag=True, help="Check again even where a pass is cached.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def native_check(device: str, formats: tuple[str, ...], no_cache: bool, as_json: bool) -> None:
    """Hold this machine's native GEMMs to the emulation: each format's GEMMs on seeded edge cases
    (zero blocks, the smallest scales, saturation, a NaN, ragged shapes), compared element by
    element within the FP32 accumulation order's bound. Exits 1 when one differs; 2, before any
    check, for a --format the device has no native GEMM for (nothing to hold to the emulation)."""
    from ablate.cli.common import environment_or_exit
    from ablate.train.device import resolve_device
    from backends.gemm import supported_formats
    from backends.gemm.selfcheck import check_device, not_native, versions
    from backends.quant import FORMATS

    environment_or_exit()  # the switches the check reads (ABLATE_NATIVE_CHECK, ...)
    try:
        dev = resolve_device(device)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--device") from None
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}; allowed: {', '.join(FORMATS)}", param_hint="--format"
        )
    missing = not_native(dev, formats)
    if missing:
        here = ", ".join(sorted(supported_formats(dev))) or "none"
        raise click.BadParameter(
            f"{', '.join(missing)}: no native GEMM on {versions(dev)} (it runs natively: {here}; "
            "`backend: emulated` runs every format on any device)",
            param_hint="--format",
        )
    log = None if as_json else (lambda line: click.echo(line, err=True))
    results = check_device(dev, formats or None, use_cache=not no_cache, log=log)
    if as_json:
        click.echo(json.dumps({"device": versions(dev), "results": results}, indent=1))
    else:
        click.echo(f"native GEMMs on {versions(dev)}:")
        if not results:
            click.echo("  no format runs natively here (`backend: emulated` runs every recipe)")
        for name, result in results.items():
            click.echo(f"  {name}: {result}")
    if any(r.startswith("FAILED") for r in results.values()):
        raise SystemExit(1)
