#!/bin/bash
# device call: gpu_check with the stages and budget given (SKIP, BUDGET, LIMIT)
T0=$(date +%s)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind ABLATE_CACHE_DIR=/tmp/ablate-cache
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 9
export PYTHONPATH=$PWD:$site
R=$OUT/r; mkdir -p $R
pack() { (cd $OUT && tar czf r.tgz r && cp r/check.log check.log 2>/dev/null); }
trap pack EXIT
nvidia-smi > $R/nvidia-smi.txt 2>&1
git rev-parse HEAD > $R/commit.txt 2>&1
echo "== gpu_check --skip $SKIP --budget $BUDGET at $(( $(date +%s) - T0 )) s"
timeout $LIMIT python3 -m ablate.bench.gpu_check --skip $SKIP --budget $BUDGET --out $R/check 2>&1 | grep -v "tl.where with a non-boolean" | tee $R/check.log
echo "rc=${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
cat $R/check/summary.md 2>/dev/null
