"""Device probe: the quantizer's kernels per plan (profile, generated code via TORCH_LOGS)."""
import json, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
from backends.quant import QuantSpec, Rotation, fake_quantize, quantize

out = sys.argv[1]
dev = torch.device("cuda")
res = {}
cases = {
    "mxfp4_rne": (QuantSpec(format="mxfp4"), -1, None, "fake"),
    "mxfp4_sr": (QuantSpec(format="mxfp4", rounding="sr"), -1, None, "fake"),
    "mxfp4_h16": (QuantSpec(format="mxfp4"), -1, Rotation(16, None), "fake"),
    "fp8_e4m3": (QuantSpec(format="fp8_e4m3"), -1, None, "fake"),
    "fp8_e4m3_codes": (QuantSpec(format="fp8_e4m3"), -1, None, "codes"),
    "mxfp4_rne_axis0": (QuantSpec(format="mxfp4"), 0, None, "fake"),
}
for shape in [(8192, 4096), (16384, 768)]:
    x = torch.randn(*shape, device=dev).to(torch.bfloat16)
    for name, (spec, axis, had, kind) in cases.items():
        def f():
            if kind == "fake":
                return fake_quantize(x, spec, axis, 1234, torch.bfloat16, had)
            return quantize(x, spec, axis=axis, key=1234)
        t0 = time.time(); f(); torch.cuda.synchronize(); first = time.time() - t0
        for _ in range(3): f()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(20): f()
        ev[1].record(); torch.cuda.synchronize()
        ms = ev[0].elapsed_time(ev[1]) / 20
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5): f()
            torch.cuda.synchronize()
        ks = []
        for e in prof.key_averages():
            if str(getattr(e, "device_type", "")).endswith("CPU"):
                continue
            us = float(getattr(e, "self_device_time_total", 0) or 0)
            if us > 0:
                ks.append((e.key, e.count, us / 5 / 1000))
        ks.sort(key=lambda k: -k[2])
        key = f"{name}@{shape[0]}x{shape[1]}"
        res[key] = {"ms": ms, "first_s": first, "kernels": ks[:12]}
        print(key, f"{ms:.4f} ms (first call {first:.1f} s)", flush=True)
        for k in ks[:8]:
            print(f"   {k[2]:.4f} ms/call {k[1]//5}x {k[0][:110]}", flush=True)
    clone_ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(3): x.clone()
    clone_ev[0].record()
    for _ in range(20): x.clone()
    clone_ev[1].record(); torch.cuda.synchronize()
    print(f"copy@{shape}: {clone_ev[0].elapsed_time(clone_ev[1]) / 20:.4f} ms", flush=True)
json.dump(res, open(f"{out}/probe.json", "w"), indent=1)
