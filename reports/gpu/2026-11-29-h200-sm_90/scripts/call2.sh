#!/bin/bash
# the second command, on the same machine: the parallel stage alone, its Inductor cache warm from
# call 1's ddp run
OUT=${OUT:?set OUT to the folder the results go to}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind ABLATE_CACHE_DIR=/tmp/ablate-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
mkdir -p $OUT/p
timeout 225 python3 -m ablate.bench.gpu_check --skip environment native tests bench study --budget 215 --scale 1.7 --out $OUT/p 2>&1 | tail -20
cat $OUT/p/parallel.json 2>/dev/null
