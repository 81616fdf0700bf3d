#!/usr/bin/env bash
# GPU probe (device tool): first calls of a warm start, warm local files vs a fresh dir served
# from the database, in alternating pairs; and what cachedb's activation adds to the start of
# a compile-worker-like process (torch + the worker's imports), with and without bytecode.
#   bash benchmarks/_warm_profile_probe.sh [MODELS] [PAIRS]   (needs .whl/; benchmarks/README.md)
# PYC=0 skips the bytecode compile (the machine sets PYTHONDONTWRITEBYTECODE=1).
set -uo pipefail
MODELS=${1:-mlp_autotune}; PAIRS=${2:-3}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B=$PWD/cachedb/_bootstrap; python3 -c "import cachedb; cachedb.CacheDB('/tmp/w.db').close()"
S="import torch; from torch._inductor.async_compile import pre_fork_setup; from torch._inductor.compile_worker.subproc_pool import SubprocPool; import torch._inductor.runtime.compile_tasks"
workerlike() { for i in 1 2; do /usr/bin/time -f "$1 plain %e s" python3 -c "$S"; CACHEDB_ENABLE=1 CACHEDB_PATH=/tmp/w.db PYTHONPATH=$B:$PYTHONPATH /usr/bin/time -f "$1 enabled %e s" python3 -c "$S"; done; }
workerlike no-pyc
[ "${PYC:-1}" = 1 ] && python3 -m compileall -q -j 0 /tmp/site $PWD/cachedb $PWD/benchmarks > /dev/null && workerlike pyc
W=/tmp/wprobe; rm -rf $W; mkdir -p $W
child() { python3 -m benchmarks._warm_child "$@" --models "$MODELS" --device cuda --t0 "$(date +%s.%N)" | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['first_call_s'], round(d['wall_s'],2), d['seconds'])"; }
echo "cold $(child files --cache-dir $W/cold/inductor 2>$OUT/cold.err)"
python3 -c "
from cachedb import CacheDB
from cachedb.fingerprint import cpp_host_key, current
from cachedb.layout.importer import Importer
with CacheDB('$W/imported.db') as db: Importer(db, fingerprint=current(), host_key=cpp_host_key()).run('$W/cold/inductor')" || exit 1
for r in $(seq 1 $PAIRS); do echo "local$r $(child files --cache-dir $W/cold/inductor 2>>$OUT/err.txt)"; echo "db$r $(child cachedb --cache-dir $W/db$r/inductor --db $W/imported.db 2>>$OUT/err.txt)"; done
