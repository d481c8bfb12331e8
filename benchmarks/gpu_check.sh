#!/bin/bash
# icrl's GPU figures (docs/results.md, "The GPU"), run on a CUDA machine from the project root, in stages:
#   bash benchmarks/gpu_check.sh "tests learner acting"      # ~4 minutes on one H200
#   bash benchmarks/gpu_check.sh "tmaze1000"                  # T-Maze 1,000 with defaults, to --max-wall (300 s)
# Stages: tests (the unit tests that take a CUDA device: captured == eager, no host sync in a replay),
# learner (benchmarks/throughput.py at the issue's four shapes, fp32 and bf16, with acting at 8 envs),
# compiled (the same with the loss compiled, bf16, two shapes), acting (1,024 envs at d64 x 1,001, 100 vector steps),
# tmaze1000, tmaze10000 (needs ~30 minutes).
# A GPU machine without registry access but with torch, numpy, rich, safetensors, matplotlib, accelerate and pytest
# needs icrl's other, pure-Python dependencies as wheels: `bash benchmarks/gpu_check.sh prepare`, run first on a
# machine with registry access from the same tree, downloads them into .gpucheck/whl (git-ignored), and every later
# stage installs them into a temp dir. Results go to $OUT (default ./gpu-results).
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = prepare ]; then  # the pure-Python wheels icrl needs beyond what a CUDA image has (Python 3.12, x86-64)
  mkdir -p .gpucheck/whl
  grep -qx "/.gpucheck/" .git/info/exclude 2>/dev/null || echo "/.gpucheck/" >> .git/info/exclude
  for p in "gymnasium>=1.0,<2" farama-notifications "tyro>=0.8" docstring-parser typeguard shtab; do
    python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform any \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --no-deps -q -d .gpucheck/whl "$p" || exit 1
  done
  ls .gpucheck/whl; exit 0
fi
R=$PWD; OUT=${OUT:-$R/gpu-results}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
STAGES=${1:-tests learner acting}; has() { [[ " $STAGES " == *" $1 "* ]]; }
MAX_WALL=${MAX_WALL:-300}
S0=$(date +%s); el() { echo "[t=$(( $(date +%s) - S0 ))s] $*"; }
SITE=$(mktemp -d)
if ls .gpucheck/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpucheck/whl/*.whl >/dev/null 2>&1 || echo "deps: install failed"
fi
PY="env PYTHONPATH=$SITE:$R python3"
$PY -c "import torch, icrl; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'icrl', icrl.__version__)" | tee "$OUT/env.txt"
if has tests; then
  timeout 240 $PY -m pytest -q -p no:cacheprovider -x tests/unit/test_graphs.py tests/unit/test_transformer.py tests/unit/test_agent.py \
    > "$OUT/pytest.txt" 2>&1; echo "pytest rc=$?"; tail -3 "$OUT/pytest.txt"; el tests
fi
B="benchmarks/throughput.py --device cuda --batch-size 24 --updates 30 --warmup 3 --breakdown-updates 1 --peak-n 8192 --peak-seconds 0.5 --threads 4 --recompute-steps 0"
if has learner; then
  for cell in "128 256 2 4" "64 1001 2 4" "256 1024 3 8" "64 501 2 4"; do set -- $cell
    for dt in fp32 bf16; do
      timeout 90 $PY $B --d-model $1 --seq-len $2 --layers $3 --heads $4 --parallel-envs 8 --dtype $dt --act-dtype $dt --tag gpu_d$1_L$2_$dt > "$OUT/tmp.log" 2>&1
      echo "rc=$? d$1 L$2 $dt" >> "$OUT/icrl.txt"; grep -E "^learner|^flops|^acting|icrl:|Warning" "$OUT/tmp.log" >> "$OUT/icrl.txt"
      tail -1 "$OUT/tmp.log" | grep '^{' >> "$OUT/icrl.jsonl" || tail -8 "$OUT/tmp.log" >> "$OUT/icrl.txt"
    done; el "learner d$1 L$2"
  done; cat "$OUT/icrl.txt"
fi
if has compiled; then  # the loss compiled (torch.compile) inside the captured update; bf16, learner only
  for cell in "128 256 2 4" "64 1001 2 4"; do set -- $cell
    timeout 150 $PY $B --d-model $1 --seq-len $2 --layers $3 --heads $4 --dtype bf16 --compile --skip-acting --tag gpu_d$1_L$2_bf16_compiled > "$OUT/tmp.log" 2>&1
    echo "rc=$? d$1 L$2 bf16 compiled" >> "$OUT/compiled.txt"; grep -E "^learner|^flops|icrl:|Warning" "$OUT/tmp.log" >> "$OUT/compiled.txt"
    tail -1 "$OUT/tmp.log" | grep '^{' >> "$OUT/icrl.jsonl" || tail -8 "$OUT/tmp.log" >> "$OUT/compiled.txt"
  done; cat "$OUT/compiled.txt"; el compiled
fi
if has acting; then
  for dt in fp32 bf16; do
    timeout 90 $PY $B --d-model 64 --seq-len 1001 --parallel-envs 1024 --act-steps 102400 --act-dtype $dt --skip-learner --tag gpu_act_1024_$dt > "$OUT/tmp.log" 2>&1
    echo "rc=$? acting 64x1001 envs 1024 $dt" >> "$OUT/acting.txt"; grep -E "^acting|icrl:|Warning" "$OUT/tmp.log" >> "$OUT/acting.txt"
    tail -1 "$OUT/tmp.log" | grep '^{' >> "$OUT/icrl.jsonl" || tail -8 "$OUT/tmp.log" >> "$OUT/acting.txt"
  done; cat "$OUT/acting.txt"; el acting
fi
for L in 1000 10000; do
  if has tmaze$L; then
    TM=$(mktemp -d)/tm$L
    timeout -s INT "$MAX_WALL" $PY -m icrl train --env tmaze --env-kwargs "{\"length\": $L}" --seed 0 --stop-at-return 0.95 \
      --stop-patience 2 --run-dir "$TM" > "$OUT/tm$L.log" 2>&1
    echo "tmaze $L rc=$?"; cp "$TM"/metrics.jsonl "$OUT/tm${L}_metrics.jsonl" 2>/dev/null; tail -c 1500 "$OUT/tm$L.log"; el "tmaze $L"
  fi
done
rm -f "$OUT/tmp.log"; el done
