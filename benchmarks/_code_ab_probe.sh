#!/usr/bin/env bash
# GPU probe (device tool): the same warm start (§1's GPU models) from one live-filled database,
# served by this tree's cachedb and by an older tree's, alternating on one host, next to warm
# local files. Every database sample starts from a byte copy of the same database, in a fresh
# cache dir and a fresh TMPDIR (as §1's "fresh machine"); warm local runs on the cold run's dir.
#   bash benchmarks/_code_ab_probe.sh cold                (the two cold runs: files, then cachedb)
#   bash benchmarks/_code_ab_probe.sh pairs OLD_DIR [N]   (N rounds of: local, new, old; order
#                                                          of new/old swapped every other round)
#   bash benchmarks/_code_ab_probe.sh pyc - [N]           (N rounds of local and new, each with
#       and without the interpreter's bytecode for torch and every other installed package: the
#       GPU machine sets PYTHONDONTWRITEBYTECODE=1 and its torch has no __pycache__, so each
#       process compiles torch's sources as it imports them; a pip-installed torch has them
#       compiled. The bytecode goes under PYTHONPYCACHEPREFIX=/tmp/pyc, nothing installed moves)
# OLD_DIR is the older sources (`git archive SHA | tar -x -C OLD_DIR`), carried as an untracked
# folder; both trees read the same schema. Needs .whl/ (benchmarks/README.md). Keeps its
# state in /tmp/code-ab between calls on a warm machine.
set -uo pipefail
PHASE=${1:?cold, pairs or pyc}; OLD=${2:-}; ROUNDS=${3:-2}
MODELS=mlp_autotune,transformer,dynamic_gpu
W=/tmp/code-ab; NEW=$PWD
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
fi
python3 -m compileall -q -j 0 /tmp/site "$NEW/cachedb" "$NEW/benchmarks" "$NEW/migrations" > /dev/null
[ -n "$OLD" ] && [ "$OLD" != - ] && python3 -m compileall -q -j 0 "$NEW/$OLD/cachedb" "$NEW/$OLD/benchmarks" "$NEW/$OLD/migrations" > /dev/null
export PYTHONUNBUFFERED=1
child() {  # TREE NAME MODE ARGS...: one _warm_child in TREE; prints first calls, wall, per-model s
  local tree=$1 name=$2 mode=$3; shift 3; local tmp=${CHILD_TMP:-$W/tmp-$name}; mkdir -p "$tmp"
  local prefix=(); [ -n "${CHILD_PYC:-}" ] && prefix=(env PYTHONPYCACHEPREFIX=/tmp/pyc)
  (cd "$tree" && TMPDIR=$tmp PYTHONPATH=/tmp/site:$tree "${prefix[@]}" python3 -m benchmarks._warm_child "$mode" \
     --models $MODELS --device cuda --t0 "$(date +%s.%N)" "$@" 2>>$W/$name.err) | tail -1 | python3 -c "
import json, sys; d = json.loads(sys.stdin.read()); s = d['seconds']
c = d['counters']
print('$name', round(d['first_call_s'], 2), 'wall', round(d['wall_s'], 2),
      {k: round(s[k], 2) for k in ('mlp_autotune', 'transformer', 'dynamic_gpu')},
      'runtime benchmarks', c.get('runtime_benchmark_gpu', 0), 'coordesc', c.get('runtime_coordesc_tuning_bench', 0))" \
    | tee -a $W/results.txt
}
case $PHASE in
cold)
  rm -rf $W; mkdir -p $W
  CHILD_TMP=$W/machine child "$NEW" cold files --cache-dir $W/cold/inductor
  child "$NEW" live-cold cachedb-cold --cache-dir $W/live-cold/inductor --db $W/live-work.db
  PYTHONPATH=/tmp/site:$NEW python3 -c "
import sqlite3
src, dst = sqlite3.connect('$W/live-work.db'), sqlite3.connect('$W/live.db')
src.backup(dst); dst.close(); src.close()" || exit 1
  ls -l $W/live.db ;;
pairs)
  [ -n "$OLD" ] || { echo "pairs needs OLD_DIR"; exit 2; }
  for r in $(seq 1 "$ROUNDS"); do
    n=$(ls $W | grep -c '^local' || true); n=$((n + 1))
    CHILD_TMP=$W/machine child "$NEW" local$n files --cache-dir $W/cold/inductor
    if [ $((n % 2)) = 1 ]; then order="new old"; else order="old new"; fi
    for who in $order; do
      tree=$NEW; [ $who = old ] && tree=$NEW/$OLD
      cp $W/live.db $W/$who$n.db
      child "$tree" $who$n cachedb --cache-dir $W/$who$n/inductor --db $W/$who$n.db
    done
  done
  cp $W/results.txt "${OUT:-/tmp}/code-ab-results.txt" ;;
pyc)
  if [ ! -d /tmp/pyc ]; then
    t=$(date +%s.%N)
    PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 0 $(python3 -c "import site, sys; print(' '.join(site.getsitepackages() + [p for p in sys.path if p.endswith('python3.12')]))") \
      /tmp/site "$NEW/cachedb" "$NEW/benchmarks" "$NEW/migrations" "$NEW/examples" > /dev/null 2>&1
    echo "bytecode under /tmp/pyc in $(python3 -c "import time; print(round(time.time() - $t, 1))") s" | tee -a $W/results.txt
  fi
  for r in $(seq 1 "$ROUNDS"); do
    n=$(ls $W | grep -c '^pyc-local' || true); n=$((n + 1))
    if [ $((n % 2)) = 1 ]; then order="pyc nopyc"; else order="nopyc pyc"; fi
    for b in $order; do
      pyc=; [ $b = pyc ] && pyc=1
      CHILD_PYC=$pyc CHILD_TMP=$W/machine child "$NEW" $b-local$n files --cache-dir $W/cold/inductor
      cp $W/live.db $W/$b-new$n.db
      CHILD_PYC=$pyc child "$NEW" $b-new$n cachedb --cache-dir $W/$b-new$n/inductor --db $W/$b-new$n.db
    done
  done
  cp $W/results.txt "${OUT:-/tmp}/code-ab-results.txt" ;;
esac
