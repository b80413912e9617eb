#!/usr/bin/env bash
# The check for a lent GPU (one NVIDIA H200-class card, no network), inside 8 minutes:
#   1. the fake_cuda tests for real on CUDA (BERTKIT_TEST_DEVICE=cuda: the skipped backward,
#      masked-position and unpadding tests run too);
#   2. a short pre-training run and a fine-tuning run through the CLI with --device cuda;
#   3. the CUDA table (benchmarks/cuda_bench.py): pre-training step (BERT-BASE, 128 tokens, bf16)
#      and variable-length inference against transformers sdpa on the same GPU, tokens/s per GPU
#      against the published rates -> benchmarks/results/cuda/cuda.{md,json}.
# Usage, from the repository root:  bash benchmarks/cuda_check.sh
# Dry run on a machine without a GPU (the same commands, tiny, on the CPU; the tests on the faked
# device; results under a temporary folder):  DEVICE=cpu bash benchmarks/cuda_check.sh
# The machine's python3 has torch (2.11, CUDA 13), transformers, sentence-transformers, pytest. bertkit
# is installed with --no-deps; what else it imports comes from wheels in $WHEELS (default .whl, which
# .git/info/exclude ignores; make them here with the `pip download --python-version 3.12 --platform
# manylinux...` line of the device tool's notes, and carry the folder).
# The top-level tests/conftest.py needs the 88 MB all-MiniLM-L6-v2 test package: the fake_cuda
# tests are run with --confcutdir so that they need nothing beyond their own folder.
# Each step has its own time limit (together 7.5 minutes); a failed step is reported and the
# next ones still run; the exit status is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
DEVICE=${DEVICE:-cuda}
WORK=$(mktemp -d)
if [ "$DEVICE" = cpu ]; then  # the dry run
    OUT="$WORK/results"; TEST_DEVICE=fake; PRECISION=fp32; STEPS=4; SIZE=tiny; BENCH="--quick"; INSTALL=0
else
    OUT=benchmarks/results/cuda; TEST_DEVICE=cuda; PRECISION=bf16; STEPS=60; SIZE=mini; BENCH=""; INSTALL=1
fi
mkdir -p "$OUT"
log() { echo "[cuda_check $(date +%H:%M:%S)] $*"; }
STATUS=0
FAILED=()
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, remember a failure
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@"
    local rc=$?
    if [ $rc -ne 0 ]; then
        log "FAILED: $name (exit $rc$([ $rc -eq 124 ] && echo ", over its ${limit} s"))"
        FAILED+=("$name"); [ $STATUS -eq 0 ] && STATUS=$rc
    fi
    return 0
}

log "torch: $($PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))')"
if [ "$INSTALL" = 1 ]; then
    # No network there: no build isolation (it would fetch setuptools); the source tree on the
    # path if even that fails. The wheels in $WHEELS (bertkit's own needs that image lacks: pysbd,
    # google-crc32c, starlette, uvicorn, httptools, orjson) go to a folder of their own.
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl \
            && export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" || log "FAILED: the wheels in $WHEELS"
    fi
    $PY -m pip install --no-deps --no-build-isolation -q -e . \
        || { log "pip install -e . failed: the source tree on PYTHONPATH instead"; export PYTHONPATH="$PWD:${PYTHONPATH:-}"; }
    $PY -c "import bertkit, pytest" || { log "FAILED: bertkit or pytest does not import"; exit 2; }
fi

log "1/3 fake_cuda tests on the $TEST_DEVICE device"
export BERTKIT_TEST_DEVICE=$TEST_DEVICE
step "fake_cuda tests" 120 $PY -m pytest -q -p no:cacheprovider -rs \
    --confcutdir=tests/fake_cuda --junitxml="$OUT/fake_cuda_tests.xml" tests/fake_cuda

log "2/3 pre-training and fine-tuning with --device $DEVICE"
# A corpus from the repository's own documents (no network): one sentence-ish line each, documents
# separated by blank lines.
$PY - "$WORK/corpus.txt" <<'PYEOF'
import re, sys
from pathlib import Path
docs = []
for path in sorted(Path(".").glob("docs/**/*.md")) + [Path("README.md")]:
    text = re.sub(r"[`*#|>\[\]()]", " ", path.read_text(errors="ignore"))
    lines = [l.strip() for l in re.split(r"(?<=[.!?])\s+|\n", text) if len(l.split()) > 4]
    if len(lines) > 4:
        docs.append("\n".join(lines))
Path(sys.argv[1]).write_text("\n\n".join(docs * 3) + "\n")
PYEOF
step "train-tokenizer" 30 $PY -m bertkit train-tokenizer --input "$WORK/corpus.txt" --vocab-size 4000 --output "$WORK/vocab"
VOCAB=$(ls "$WORK"/vocab/vocab.txt 2>/dev/null || ls "$WORK"/vocab)
step "create-pretraining-data" 45 $PY -m bertkit create-pretraining-data --input "$WORK/corpus.txt" --vocab "$VOCAB" \
    --output "$WORK/data" --max-seq-length 128 --dupe-factor 2 --no-progress
step "pretrain" 75 $PY -m bertkit pretrain --train-data "$WORK/data" --output "$WORK/pretrained" --model-config $SIZE \
    --vocab "$VOCAB" --max-steps $STEPS --batch-size 32 --device $DEVICE --precision $PRECISION --logging-steps 20 --no-progress
tail -2 "$WORK/pretrained/metrics.jsonl" 2>/dev/null | tee "$OUT/pretrain_metrics_tail.jsonl"
$PY - "$WORK" <<'PYEOF'
import csv, random, sys
random.seed(0)
good, bad = "fine great clear fast helpful".split(), "slow broken wrong confusing poor".split()
with open(f"{sys.argv[1]}/train.csv", "w", newline="") as f:
    w = csv.writer(f); w.writerow(["text", "label"])
    for i in range(400):
        label = i % 2
        words = random.choices(good if label else bad, k=6) + random.choices(good + bad, k=3)
        w.writerow([" ".join(words), "pos" if label else "neg"])
PYEOF
step "finetune" 60 $PY -m bertkit finetune text-classification --train-file "$WORK/train.csv" --dev-fraction 0.2 \
    --model "$WORK/pretrained" --output "$WORK/finetuned" --epochs 2 --batch-size 32 --device $DEVICE \
    --precision $PRECISION --logging-steps 10
cp "$WORK/finetuned/results.json" "$OUT/finetune_results.json" 2>/dev/null

log "3/3 the CUDA table"
step "cuda_bench" 120 $PY benchmarks/cuda_bench.py --device $DEVICE $BENCH --out "$OUT"
if [ ${#FAILED[@]} -eq 0 ]; then log "done, all steps passed: $OUT"; else log "done, failed: ${FAILED[*]} ($OUT)"; fi
exit $STATUS
