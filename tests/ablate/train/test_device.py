"""Device names and the autocast policy."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from ablate.train.device import autocast, resolve_device


def test_resolve_device_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"device: unknown 'tpu7'; allowed: auto, cpu, cuda"):
        resolve_device("tpu7")


@pytest.mark.parametrize("name", ["meta", "mps", "xpu", "cpu:3", "cuda:-1", ""])
def test_a_device_no_run_trains_on_is_refused_by_name(name):
    """torch.device takes meta, mps, xpu and cpu:3: a study's run on them failed (meta: "Cannot
    copy out of meta tensor") after validate, and native-check printed "native GEMMs on mps"."""
    from click.testing import CliRunner

    from ablate.cli import main

    with pytest.raises(ValueError, match=r"device: unknown .*; allowed: auto, cpu, cuda, cuda:N"):
        resolve_device(name)
    res = CliRunner().invoke(main, ["native-check", "--device", name])
    assert res.exit_code == 2 and "--device" in res.output and "unknown" in res.output, res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="no CUDA device is available; use cpu"):
        resolve_device("cuda")


def test_autocast_policy():
    cpu = torch.device("cpu")
    assert isinstance(autocast("fp32", cpu), nullcontext)
    assert isinstance(autocast("auto", cpu), nullcontext)  # auto is bf16 only on a CUDA device
    with autocast("bf16", cpu):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
