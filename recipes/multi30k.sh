#!/usr/bin/env bash
# Multi30k (Task 1) German → English on CPU with a time budget.
#
#   bash recipes/multi30k.sh DATA_DIR OUT_DIR
#   bash recipes/multi30k.sh /work/shared/data/multi30k /tmp/multi30k_runs/final
#
# DATA_DIR holds {train,val}.{de,en}.gz (read its README: non-commercial research/education use only;
# never copy the data into this repository). Everything is written under OUT_DIR.
#
# Stages and their budget (total ≤ 60 minutes wall on 2 CPU cores):
#   1. shared byte-level BPE, 8000 tokens, on both sides of the training split (~15 s)
#   2. training for TRAIN_MINUTES wall (default 50), a small post-LN model (d_model 256, 3+3 layers,
#      4 heads, d_ff 1024, P_drop 0.1, ε_ls 0.1; 7.6 M parameters), token-budget batches of
#      MAX_TOKENS (4000) source + target tokens, inverse-sqrt schedule (Eq. 3's shape) with WARMUP
#      (400) warmup steps and an explicit peak LR (1e-3; Eq. 3's own peak, 256^-0.5 · 400^-0.5 =
#      3.1e-3, is too high for this post-LN model), no gradient clipping (MAX_GRAD_NORM 0, the
#      paper's; runs 1 and 2 below clipped at 1.0, HF's default then), a weights-only checkpoint
#      every SAVE_STEPS (60) steps. The schedule does not depend on max_steps, so the run is stopped
#      by the clock (`--max_train_minutes`, a checkpoint at the stop) instead of a step count: how many
#      steps fit depends on the CPU and the load. COOLDOWN (0) > 0 lowers the learning rate linearly
#      to 0 over that last fraction of the minutes (`--lr_cooldown_fraction`, a deviation from Eq. (3)).
#      BF16 (auto) trains in bfloat16 autocast where the CPU has AVX512-BF16, AMX or Arm BF16 (float32
#      weights and checkpoints), else in float32 (`hf-vanilla-train --bf16 auto` decides); the choice
#      goes into train.log and times.log ("precision: ..."). The runs measured below trained in float32.
#      Measured: 3,036 steps (12.8 epochs) in 50 minutes on a 2-core AMD EPYC with AVX-512 (run 3);
#      2,422 steps (10.2 epochs) on a 2-core AMD EPYC with AVX2 (run 2); 5,635 steps (23.8 epochs)
#      in 40 minutes on a 2-core Intel Xeon with AMX (run 5, BLEU 40.23); 6,310 steps (26.6 epochs) in
#      50 minutes there (run 6, BF16=false, BLEU 40.15); 1,074 steps (4.5 epochs) on a slower 2-core
#      AMD EPYC VM with AVX2 only (run 8, BLEU 32.44; COOLDOWN=0.3 there: 33.71, run 9); 3,483 steps
#      (14.7 epochs) on another AMD EPYC VM with AVX2 only (run 11, BLEU 40.95; COOLDOWN=0.3 there:
#      40.86 averaged, 41.36 last checkpoint, run 10). On the Xeon of runs 5 and 6,
#      bfloat16 trained slower than float32 (docs/recipe.md, "Mixed precision on the CPU").
#   3. average the last LAST_N (5) complete checkpoints by step number (§6.1; the last 240 steps,
#      ~1 epoch) (~10 s): `average_checkpoints.py --run_dir OUT_DIR/train --last_n 5` picks them (the
#      package's one "last N by step", not the shell's), prints them ("averaged: ..." here and in
#      times.log) and records them in OUT_DIR/averaged/averaged_checkpoints.json
#   4. beam 4, α = 0.6 (HF's |Y|^α), stop when no better hypothesis can appear (early_stopping never)
#      on the full validation set (1014 sentences) with sacreBLEU (cased, 13a) (~35 s)
#   5. (outside the budget) the same evaluation of the last complete checkpoint by step (named by
#      `average_checkpoints.py --run_dir OUT_DIR/train --list_checkpoints`, printed as "last checkpoint: ..."),
#      for comparison.
#
# Knobs (environment variables; the defaults are the measured run's, but for BF16: those runs trained in
# float32): TRAIN_MINUTES (50), MAX_STEPS (100000: the clock stops the run first), SAVE_STEPS (60),
# LAST_N (5), VOCAB_SIZE (8000), D_MODEL (256), LAYERS (3), HEADS (4), FFN_DIM (1024), DROPOUT (0.1),
# MAX_TOKENS (4000), WARMUP (400), LR (1e-3), MAX_GRAD_NORM (0), BF16 (auto; false: float32 everywhere),
# COOLDOWN (0), OMP_NUM_THREADS (2).
# tests/cli/test_scripts.py runs the recipe with a tiny model and a few dozen steps.
# The recipe once sorted the checkpoints itself with `sort -t- -k2 -n`, which splits on every
# `-` of the path: with a hyphen in OUT_DIR it averaged steps 720-960 of a 3,675-step run (BLEU 30.46)
# and evaluated step 960 as "the last checkpoint".
# Measured runs: docs/recipe.md, "Real data" (its table of runs, single checkpoints, averaging windows,
# and the ensemble of the last checkpoints against their average).
set -euo pipefail

DATA_DIR=${1:?usage: $0 DATA_DIR OUT_DIR}
OUT_DIR=${2:?usage: $0 DATA_DIR OUT_DIR}
TRAIN_MINUTES=${TRAIN_MINUTES:-50}
MAX_STEPS=${MAX_STEPS:-100000}
SAVE_STEPS=${SAVE_STEPS:-60}
LAST_N=${LAST_N:-5}
VOCAB_SIZE=${VOCAB_SIZE:-8000}
D_MODEL=${D_MODEL:-256}
LAYERS=${LAYERS:-3}
HEADS=${HEADS:-4}
FFN_DIM=${FFN_DIM:-1024}
DROPOUT=${DROPOUT:-0.1}
MAX_TOKENS=${MAX_TOKENS:-4000}
WARMUP=${WARMUP:-400}
LR=${LR:-1e-3}
MAX_GRAD_NORM=${MAX_GRAD_NORM:-0}
BF16=${BF16:-auto}
COOLDOWN=${COOLDOWN:-0}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
stamp() { echo "[$(date -u +%H:%M:%S)] $* | $(uptime | sed 's/.*load/load/')" | tee -a "$OUT_DIR/times.log"; }

stamp "start tokenizer"
python "$REPO/scripts/train_tokenizer.py" --train_files "$DATA_DIR/train" \
    --source_lang de --target_lang en --vocab_size "$VOCAB_SIZE" --output_dir "$OUT_DIR/tokenizer"

stamp "start training (${TRAIN_MINUTES} min)"
status=0
# train.py stops itself after TRAIN_MINUTES of training (--max_train_minutes, with a checkpoint); the
# `timeout` 5 minutes later only guards against a run that hangs (it saves and stops on SIGTERM too).
HARD_STOP=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { print m + 5 }')
timeout --signal=TERM "${HARD_STOP}m" python "$REPO/scripts/train.py" \
    --train_files "$DATA_DIR/train" --validation_files "$DATA_DIR/val" \
    --source_lang de --target_lang en --tokenizer_name_or_path "$OUT_DIR/tokenizer" \
    --d_model "$D_MODEL" --layers "$LAYERS" --attention_heads "$HEADS" --ffn_dim "$FFN_DIM" --dropout "$DROPOUT" \
    --label_smoothing 0.1 --max_tokens "$MAX_TOKENS" --warmup_steps "$WARMUP" --learning_rate "$LR" \
    --max_steps "$MAX_STEPS" --max_train_minutes "$TRAIN_MINUTES" --lr_cooldown_fraction "$COOLDOWN" \
    --max_grad_norm "$MAX_GRAD_NORM" --bf16 "$BF16" \
    --save_steps "$SAVE_STEPS" --save_only_model --eval_strategy no --do_eval false \
    --logging_steps 10 --disable_tqdm true --report_to none --output_dir "$OUT_DIR/train" \
    > "$OUT_DIR/train.log" 2>&1 || status=$?
if [ "$status" -ne 124 ] && [ "$status" -ne 0 ]; then
    echo "training failed with status $status; see $OUT_DIR/train.log" >&2
    exit "$status"
fi
# The precision the run chose (--bf16 auto: bfloat16 autocast where the CPU computes it natively).
grep -m 1 -o "Precision: .*" "$OUT_DIR/train.log" | sed "s/^Precision/precision/" | tee -a "$OUT_DIR/times.log" || true

stamp "start averaging"
# The package picks the checkpoints: the last LAST_N checkpoint-<step> folders by step number, whatever
# the characters of OUT_DIR; averaged/averaged_checkpoints.json records them.
python "$REPO/scripts/average_checkpoints.py" --run_dir "$OUT_DIR/train" --last_n "$LAST_N" \
    --output_dir "$OUT_DIR/averaged"
echo "averaged: $(python -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["averaged_checkpoints"]))' \
    "$OUT_DIR/averaged/averaged_checkpoints.json")" | tee -a "$OUT_DIR/times.log"
# The newest complete checkpoint (the last line of the package's listing, oldest first by step).
LAST=$(python "$REPO/scripts/average_checkpoints.py" --run_dir "$OUT_DIR/train" --list_checkpoints | tail -n 1)
echo "last checkpoint: $LAST" | tee -a "$OUT_DIR/times.log"

stamp "start evaluation of the averaged model"
python "$REPO/scripts/evaluate_bleu.py" --model_name_or_path "$OUT_DIR/averaged" \
    --tokenizer_name_or_path "$OUT_DIR/tokenizer" --validation_files "$DATA_DIR/val" \
    --source_lang de --target_lang en --split validation --num_beams 4 --length_penalty 0.6 \
    --early_stopping never --output_dir "$OUT_DIR/eval_averaged"
stamp "end of the 60-minute budget"

python "$REPO/scripts/evaluate_bleu.py" --model_name_or_path "$LAST" \
    --tokenizer_name_or_path "$OUT_DIR/tokenizer" --validation_files "$DATA_DIR/val" \
    --source_lang de --target_lang en --split validation --num_beams 4 --length_penalty 0.6 \
    --early_stopping never --output_dir "$OUT_DIR/eval_last"
stamp "done (last-checkpoint evaluation included)"
