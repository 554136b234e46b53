#!/bin/bash
# one device call: native self-check, quantizer probe, bench with profiles, the compile tests
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
export PYTHONPATH=$PWD:$site
R=$OUT/r; mkdir -p $R
pack() { (cd $OUT && tar czf r.tgz r); }
trap pack EXIT
nvidia-smi > $R/nvidia-smi.txt 2>&1
echo "== check $(left 999)"; timeout 70 python3 -m ablate.bench.gpu_check --skip tests bench parallel study --budget 65 --out $R/check > $R/check.log 2>&1; echo rc=$?
pack
echo "== probe $(left 999)"; TORCH_LOGS=output_code timeout 100 python3 _gpu/probe.py $R > $R/probe.log 2> $R/probe_code.log; echo rc=$?
tail -c 3000 $R/probe.log
pack
echo "== bench $(left 999)"; timeout $(left 400) python3 -m ablate.bench.gpu --presets 125m --recipes bf16 fp8 mxfp4 --profile fp8 mxfp4 --steps 10 --warmup 2 --repeats 5 --no-gemms --out $R/bench > $R/bench.log 2>&1; echo rc=$?
grep -v Warn $R/bench.log | tail -c 4000
pack
L=$(left ${BUDGET:-470}); echo "== tests $L"
if [ $L -gt 40 ]; then timeout $L python3 -m pytest -m gpu -p no:cacheprovider -q -x tests/backends/gemm tests/ablate/train/test_compile_rehearsal.py -k "native or rehears or compiled" > $R/tests.log 2>&1; echo rc=$?; tail -15 $R/tests.log; fi
