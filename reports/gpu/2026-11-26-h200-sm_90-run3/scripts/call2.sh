#!/bin/bash
T0=$(date +%s); left() { echo $(( $1 - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
export PYTHONPATH=$PWD:$site
R=$OUT/r; mkdir -p $R
pack() { (cd $OUT && tar czf r.tgz r); }
trap pack EXIT
nvidia-smi > $R/nvidia-smi.txt 2>&1
echo "== check $(left 999)"; timeout 60 python3 -m ablate.bench.gpu_check --skip tests bench parallel study --budget 55 --out $R/check > $R/check.log 2>&1; echo rc=$?; tail -3 $R/check/native.log
pack
echo "== ab $(left 999)"; timeout $(left 330) python3 _gpu/ab.py $R $(left 320) > $R/ab.log 2>&1; echo rc=$?; grep -v Warn $R/ab.log | grep -v "^  _warn" | tail -c 5000
pack
L=$(left ${BUDGET:-455}); echo "== tests $L"
if [ $L -gt 40 ]; then ABLATE_QUANT_OPS=0 timeout $L python3 -m pytest -m gpu -p no:cacheprovider -q tests/ablate/train/test_compile_rehearsal.py > $R/tests.log 2>&1; echo rc=$?; grep -E "PASS|FAIL|passed|failed" $R/tests.log | tail -12; fi
