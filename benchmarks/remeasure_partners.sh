#!/bin/sh
# Re-measure the 15- and 60-minute pre-training rows of benchmarks/results/pretraining_budget.md on
# data with whole-corpus NotNext partners (the default now), beside the same runs on the old
# block-local data on the same machine, so that a difference is the partners' and not the machine's.
# Run on a quiet 2-core machine, nothing else timed alongside (about 2.7 hours; each --work folder
# makes its vocabulary and data first, ~10 minutes). Then the vocabulary row: the recipe on data made
# with bert-base-uncased's 30,522 pieces (its batch halved by the vocabulary rule), 15 minutes.
#
#   BERTKIT_DATA=../shared/data sh benchmarks/remeasure_partners.sh [WORK_ROOT]
set -eu
DATA=${BERTKIT_DATA:?set BERTKIT_DATA to the data folder}
ROOT=${1:-/tmp/ptb-remeasure}
PY=${PYTHON:-python}
for scheme in corpus block; do
    for budget in 15m 60m; do
        "$PY" benchmarks/pretrain_budget.py --data-dir "$DATA" --work "$ROOT/$scheme" --not-next-partners "$scheme" \
            --budget "$budget" --systems bertkit --name "bertkit_${budget}_$scheme"
    done
    "$PY" benchmarks/pretrain_budget.py --work "$ROOT/$scheme" --report "benchmarks/results/pretraining_budget/${scheme}_partners"
done
"$PY" benchmarks/pretrain_budget.py --data-dir "$DATA" --work "$ROOT/vocab30522" \
    --vocab "$DATA/vocab/bert-base-uncased-vocab.txt" --budget 15m --systems bertkit --name bertkit_15m_vocab30522
"$PY" benchmarks/pretrain_budget.py --work "$ROOT/vocab30522" --report benchmarks/results/pretraining_budget/vocab30522
