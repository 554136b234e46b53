#!/bin/bash
# command 2, on the same machine right after command 1: the tests stage with what was left
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind ABLATE_CACHE_DIR=/tmp/ablate-cache PYTHONPATH=$PWD:/tmp/site
mkdir -p $OUT/r
(timeout 245 python3 -m ablate.bench.gpu_check --skip environment native bench parallel study --budget 240 --scale 1.4 --out $OUT/r/t 2>&1 | tee $OUT/r/tests_check.log)
cd $OUT && tar czf t.tgz r
