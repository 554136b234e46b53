#!/bin/bash
# on the GPU machine, in the repository's root: the native self-check and the parallel stage
# (gpu_check) beside every GPU test (pytest -m gpu, 8 workers), then the 125m bench's step times
# in what time is left; .whl holds the wheels, .gpu/commit.txt the commit where git is absent
OUT=${OUT:?set OUT to the folder the results go to}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
END=${END:-560}  # run as END=555
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind ABLATE_CACHE_DIR=/tmp/ablate-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=$PWD:/tmp/site
R=$OUT/r; mkdir -p $R
pack() { (cd $OUT && tar czf r.tgz r); }
trap pack EXIT
nvidia-smi > $R/nvidia-smi.txt 2>&1
(git rev-parse HEAD 2>/dev/null || cat .gpu/commit.txt) > $R/commit.txt
git status --short > $R/git-status.txt 2>&1
python3 -c "import torch,sys;print(torch.__version__,torch.version.cuda,sys.version)" > $R/versions.txt 2>&1
echo "== start at $(el) s: $(cat $R/versions.txt)"
(timeout 330 python3 -m ablate.bench.gpu_check --skip tests bench study --budget 320 --scale 2 --out $R/check > $R/check.log 2>&1; echo "gpu_check rc=$? at $(el) s" >> $R/check.log) &
CHECK=$!
timeout $(( END - 100 )) python3 -m pytest -n 8 -v -m gpu -p no:cacheprovider -rs \
  --continue-on-collection-errors --junitxml $R/tests.xml --durations=40 --timeout 420 \
  tests/backends/gemm/test_native.py tests/backends/quant/test_quant_rules.py \
  tests/ablate/train/test_compile_rehearsal.py 2>&1 | grep -v "tl.where with a non-boolean" > $R/tests.log
echo "pytest rc=${PIPESTATUS[0]} at $(el) s"
tail -45 $R/tests.log
wait $CHECK
echo "== check done at $(el) s"; cat $R/check/summary.md 2>/dev/null | head -30
LEFT=$(( END - $(el) ))
echo "== bench with $LEFT s left"
if [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 -m ablate.bench.gpu --presets 125m --recipes bf16 mxfp4 fp8 --steps 10 \
    --warmup 2 --profile-steps 0 --no-gemms --out $R --name bench 2>&1 \
    | grep -v "tl.where with a non-boolean" > $R/bench.log
  echo "bench rc=${PIPESTATUS[0]} at $(el) s"; tail -30 $R/bench.log
fi
echo "== end at $(el) s"
