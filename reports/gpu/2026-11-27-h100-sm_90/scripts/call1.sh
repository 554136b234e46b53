#!/bin/bash
# command 1 on the GPU machine: make gpu-check's numerics and figures (environment, native, bench, study)
T0=$(date +%s)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind ABLATE_CACHE_DIR=/tmp/ablate-cache
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 9
export PYTHONPATH=$PWD:$site
R=$OUT/r; mkdir -p $R
pack() { (cd $OUT && tar czf r.tgz r && cp r/check.log check.log 2>/dev/null); }
trap pack EXIT
nvidia-smi > $R/nvidia-smi.txt 2>&1
git rev-parse HEAD > $R/commit.txt 2>&1
echo "== gpu_check at $(( $(date +%s) - T0 )) s"
timeout 560 python3 -m ablate.bench.gpu_check --skip tests parallel --budget ${BUDGET:-540} --scale 2 --out $R/check 2>&1 | grep -v -i "warn" | tee $R/check.log
echo "rc=$? at $(( $(date +%s) - T0 )) s"
cat $R/check/summary.md 2>/dev/null
