"""Device A/B: 125m step time with the quantizer as opaque ops (default) and traced inline."""
import json, os, sys, time
import torch
from ablate.bench import train as tb
from ablate.bench.gpu import profile
from ablate.train.state import TrainState

out, deadline = sys.argv[1], time.time() + float(sys.argv[2])
plan = [("bf16", "1"), ("mxfp4", "1"), ("mxfp4", "0"), ("fp8", "1"), ("fp8", "0"), ("mxfp4_h16", "1"), ("mxfp4_h16", "0")]
dev = torch.device("cuda")
res = []
for name, ops in plan:
    if time.time() > deadline - 60:
        print("deadline: stop before", name, ops, flush=True); break
    os.environ["ABLATE_QUANT_OPS"] = ops
    row = {"recipe": name, "quant_ops": ops}
    try:
        cfg = tb.run_config("125m", tb.RECIPES[name], 8, 2048, "cuda", tb.backend_for(name, dev), "auto", tb.preset_vocab("125m"), "none")
        t0 = time.time()
        run = tb.build(cfg); st = TrainState()
        for _ in range(2): run.optimizer_step(st)
        torch.cuda.synchronize(); row["warmup_s"] = time.time() - t0
        ms = tb.time_steps(run, st, 1, 10)
        row["ms"] = ms; row["step_ms"] = sorted(ms)[len(ms) // 2]
        print(f"{name} ops={ops}: warm-up {row['warmup_s']:.1f} s, {row['step_ms']:.2f} ms/step {['%.2f' % m for m in ms]}", flush=True)
        if name != "bf16":
            pr = profile(run, st, 2, row["step_ms"], top=12)
            row["profile"] = pr
            print(f"  busy {pr['busy_fraction']:.2f}; " + ", ".join(f"{k} {v['total_ms'] / 2:.1f} ms" for k, v in pr["by_kind"].items()), flush=True)
            for k in pr["top"][:6]:
                print(f"   {k['total_ms'] / 2:7.2f} ms/step {k['calls'] // 2:5d}x {k['name'][:90]}", flush=True)
        del run, st
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        print(f"{name} ops={ops}: FAILED {row['error']}", flush=True)
    res.append(row)
    torch.cuda.empty_cache()
    json.dump(res, open(f"{out}/ab.json", "w"), indent=1)
