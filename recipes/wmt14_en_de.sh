#!/usr/bin/env bash
# The paper's experiment: WMT 2014 English → German, Transformer base or big (§5, §6.1, Table 2).
#
#   SIZE=base bash recipes/wmt14_en_de.sh OUT_DIR        # one machine, all its GPUs, DDP, bf16
#   SIZE=big  bash recipes/wmt14_en_de.sh OUT_DIR
#   # several machines (OUT_DIR on a filesystem every machine sees), the same command on each:
#   SIZE=big NNODES=4 NODE_RANK=$R MASTER_ADDR=node0 MASTER_PORT=29500 bash recipes/wmt14_en_de.sh OUT_DIR
#
# docs/reproducing.md explains every stage, the expected time and how the scores are computed.
# Stages (STAGES, default "tokenizer train average evaluate"; node rank 0 runs all but "train", the other
# nodes wait for OUT_DIR/tokenizer and then train):
#   1. tokenizer: a 37000-token shared byte-level BPE (§5.1) on both sides of the training data
#      (hf-vanilla-train-tokenizer) -> OUT_DIR/tokenizer. Skipped when it exists.
#   2. train: scripts/train.py under torchrun (LAUNCHER=torchrun, default; DDP) or accelerate launch
#      (LAUNCHER=accelerate, ENGINE=ddp|fsdp: configs/accelerate/ENGINE.yaml; FSDP2 needs accelerate)
#      on NNODES × GPUS_PER_NODE processes. The Table 3 model of SIZE (base: dropout 0.1, big: 0.3),
#      label smoothing 0.1, Adam β=(0.9, 0.98) ε=1e-9, Eq. 3 with 4000 warmup steps, no clipping
#      (the package's defaults). A step is TOKENS_PER_STEP (50000: ~25000 source + 25000 target, §5.1)
#      summed over processes and accumulation: --max_tokens = TOKENS_PER_STEP / (processes × GRAD_ACCUM)
#      per process and micro-batch, whatever the number of GPUs. MAX_STEPS: 100000 (base) / 300000 (big).
#      Checkpoints: the paper wrote one every 10 minutes; the Trainer saves by steps, so SAVE_STEPS
#      converts the paper's 10 minutes with its own step times (§5.2: 0.4 s base, 1.0 s big on 8 P100s):
#      1500 steps (base), 600 (big). The averaged window then spans the same number of steps as the
#      paper's (5 × 1500 = 7500 for base, 20 × 600 = 12000 for big), however fast the GPUs are.
#      A node that dies stops the run: the other nodes' training processes fail at their next collective
#      (at once when the node's processes are gone; after --ddp_timeout, 1800 s by default, when its
#      machine vanishes silently), their torchrun exits and this script ends in one line, status 1
#      (docs/reproducing.md). A node's training process dies with its torchrun, however torchrun ends.
#      Relaunching the same command after a crash or a killed node resumes the run from the newest
#      complete checkpoint (--resume_from_checkpoint last); nothing else changes. Only the newest KEEP
#      (LAST_N) checkpoints are kept (each holds the Adam state too: ~0.8 GB base, ~2.6 GB big).
#   3. average (node 0): the last LAST_N (5 base, 20 big) complete checkpoints by step
#      (hf-vanilla-average --run_dir --last_n) -> OUT_DIR/averaged.
#   4. evaluate (node 0): newstest2014 (sacreBLEU's wmt14, en-de) with beam 4, α 0.6, max length
#      source + 50 (the package's decoding defaults), scored as sacreBLEU (cased 13a, with its signature)
#      and as the paper's tokenized BLEU with compound splitting (--tokenized_bleu 13a) -> OUT_DIR/eval.
#
# Knobs (environment variables): SIZE (base|big), NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
# MASTER_PORT (29500), RUN_ID (wmt14; torchrun's --rdzv_id), RDZV_CONF (torchrun's --rdzv_conf, e.g.
# is_host=0 where the rendezvous store runs outside the nodes), GPUS_PER_NODE (the machine's GPU count, from nvidia-smi; 1 without one),
# GRAD_ACCUM (1), PRECISION (bf16|fp16|no; bf16), LAUNCHER (torchrun|accelerate), ENGINE (ddp|fsdp),
# TOKENS_PER_STEP (50000), MAX_STEPS, SAVE_STEPS, LAST_N, KEEP, WARMUP (4000), VOCAB_SIZE (37000),
# DATASET (wmt14) and DATASET_CONFIG (de-en) for the Hub, or TRAIN_FILES / VALID_FILES (local files, any
# format hf-vanilla-train reads) instead, STAGES, DRY_RUN=1 (print the commands, run nothing), and
# TRAIN_EXTRA (more scripts/train.py arguments, last so they win; tests/training/test_wmt14_recipe.py
# rehearses two nodes with a tiny model through it).
set -euo pipefail

OUT_DIR=${1:?usage: SIZE=base|big $0 OUT_DIR}
SIZE=${SIZE:-base}
case "$SIZE" in
    base) DEFAULT_STEPS=100000 DEFAULT_SAVE=1500 DEFAULT_LAST_N=5 ;;
    big) DEFAULT_STEPS=300000 DEFAULT_SAVE=600 DEFAULT_LAST_N=20 ;;
    *) echo "error: SIZE=$SIZE: give SIZE=base or SIZE=big (Table 3)." >&2; exit 2 ;;
esac
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
if [ -z "${GPUS_PER_NODE:-}" ]; then
    GPUS_PER_NODE=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
    [ "${GPUS_PER_NODE:-0}" -ge 1 ] || GPUS_PER_NODE=1
fi
GRAD_ACCUM=${GRAD_ACCUM:-1}
PRECISION=${PRECISION:-bf16}
LAUNCHER=${LAUNCHER:-torchrun}
ENGINE=${ENGINE:-ddp}
TOKENS_PER_STEP=${TOKENS_PER_STEP:-50000}
MAX_STEPS=${MAX_STEPS:-$DEFAULT_STEPS}
SAVE_STEPS=${SAVE_STEPS:-$DEFAULT_SAVE}
LAST_N=${LAST_N:-$DEFAULT_LAST_N}
KEEP=${KEEP:-$LAST_N}
WARMUP=${WARMUP:-4000}
VOCAB_SIZE=${VOCAB_SIZE:-37000}
DATASET=${DATASET:-wmt14}
DATASET_CONFIG=${DATASET_CONFIG:-de-en}
STAGES=${STAGES:-tokenizer train average evaluate}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}

PROCESSES=$((NNODES * GPUS_PER_NODE))
MAX_TOKENS=$((TOKENS_PER_STEP / (PROCESSES * GRAD_ACCUM)))
case "$PRECISION" in
    bf16) PRECISION_ARGS=(--bf16 true) ;;
    fp16) PRECISION_ARGS=(--fp16 true) ;;
    no) PRECISION_ARGS=() ;;
    *) echo "error: PRECISION=$PRECISION: give bf16, fp16 or no." >&2; exit 2 ;;
esac
if [ "$ENGINE" != ddp ] && [ "$ENGINE" != fsdp ]; then
    echo "error: ENGINE=$ENGINE: give ddp or fsdp (configs/accelerate/)." >&2; exit 2
fi
if [ "$ENGINE" = fsdp ] && [ "$LAUNCHER" != accelerate ]; then
    echo "error: ENGINE=fsdp needs LAUNCHER=accelerate (configs/accelerate/fsdp.yaml)." >&2; exit 2
fi
if [ -n "${TRAIN_FILES:-}" ]; then
    DATA_ARGS=(--train_files $TRAIN_FILES)  # word-split on purpose: several files allowed
    [ -z "${VALID_FILES:-}" ] || DATA_ARGS+=(--validation_files $VALID_FILES)
else
    DATA_ARGS=(--dataset_name "$DATASET" --dataset_config_name "$DATASET_CONFIG")
fi
run() {
    echo "+ $*"
    [ "${DRY_RUN:-0}" = 1 ] || "$@"
}
has() { [[ " $STAGES " == *" $1 "* ]]; }

echo "plan: SIZE=$SIZE, $NNODES node(s) × $GPUS_PER_NODE process(es), GRAD_ACCUM=$GRAD_ACCUM, $PRECISION;" \
    "--max_tokens $MAX_TOKENS per process and micro-batch = $((MAX_TOKENS * PROCESSES * GRAD_ACCUM)) tokens" \
    "per step; $MAX_STEPS steps, a checkpoint every $SAVE_STEPS, average the last $LAST_N"

if has tokenizer && [ "$NODE_RANK" = 0 ] && [ ! -f "$OUT_DIR/tokenizer/tokenizer.json" ]; then
    run python "$REPO/scripts/train_tokenizer.py" "${DATA_ARGS[@]}" --source_lang en --target_lang de \
        --vocab_size "$VOCAB_SIZE" --output_dir "$OUT_DIR/tokenizer"
fi

if has train; then
    if [ "${DRY_RUN:-0}" != 1 ]; then
        waited=0  # the other nodes wait (at most TOKENIZER_WAIT seconds) for node 0's tokenizer
        until [ -f "$OUT_DIR/tokenizer/tokenizer.json" ]; do
            if [ "$waited" -ge "${TOKENIZER_WAIT:-7200}" ]; then
                echo "error: no tokenizer in $OUT_DIR/tokenizer after ${waited} s: run node 0 (NODE_RANK=0) with" \
                    "the same OUT_DIR on a shared filesystem." >&2
                exit 1
            fi
            sleep 10 && waited=$((waited + 10))
        done
    fi
    RESUME_ARGS=(--overwrite true)  # an empty or checkpoint-less folder (train.py refuses other runs')
    if [ -d "$OUT_DIR/train" ] && [ -n "$(python "$REPO/scripts/average_checkpoints.py" \
        --run_dir "$OUT_DIR/train" --list_checkpoints 2>/dev/null)" ]; then
        RESUME_ARGS=(--resume_from_checkpoint last)
    fi
    if [ "$LAUNCHER" = torchrun ]; then
        if [ "$NNODES" = 1 ]; then
            RDZV=(--standalone)
        else
            RDZV=(--rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "${RUN_ID:-wmt14}")
            [ -z "${RDZV_CONF:-}" ] || RDZV+=(--rdzv_conf "$RDZV_CONF")
        fi
        LAUNCH=(python -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$GPUS_PER_NODE" "${RDZV[@]}")
    elif [ "$LAUNCHER" = accelerate ]; then
        LAUNCH=(python -m accelerate.commands.launch --config_file "$REPO/configs/accelerate/$ENGINE.yaml"
            --num_processes "$PROCESSES" --num_machines "$NNODES" --machine_rank "$NODE_RANK"
            --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" --mixed_precision "$PRECISION")
    else
        echo "error: LAUNCHER=$LAUNCHER: give torchrun or accelerate." >&2; exit 2
    fi
    status=0
    run "${LAUNCH[@]}" "$REPO/scripts/train.py" "${DATA_ARGS[@]}" --source_lang en --target_lang de \
        --tokenizer_name_or_path "$OUT_DIR/tokenizer" --preset "$SIZE" --label_smoothing 0.1 \
        --max_tokens "$MAX_TOKENS" --gradient_accumulation_steps "$GRAD_ACCUM" "${PRECISION_ARGS[@]}" \
        --warmup_steps "$WARMUP" --max_steps "$MAX_STEPS" --save_steps "$SAVE_STEPS" --save_total_limit "$KEEP" \
        --eval_strategy no --do_eval false --logging_steps 100 --disable_tqdm true \
        --output_dir "$OUT_DIR/train" "${RESUME_ARGS[@]}" ${TRAIN_EXTRA:-} || status=$?
    if [ "$status" -ne 0 ]; then
        echo "error: training stopped with status $status on node $NODE_RANK (a node or process failed; its log" \
            "is above): run the same command again on every node to resume from the newest complete" \
            "checkpoint in $OUT_DIR/train." >&2
        exit 1
    fi
fi

[ "$NODE_RANK" = 0 ] || exit 0
if has average; then
    run python "$REPO/scripts/average_checkpoints.py" --run_dir "$OUT_DIR/train" --last_n "$LAST_N" \
        --output_dir "$OUT_DIR/averaged"
fi
if has evaluate; then
    run python "$REPO/scripts/evaluate_bleu.py" --model_name_or_path "$OUT_DIR/averaged" \
        --tokenizer_name_or_path "$OUT_DIR/tokenizer" --sacrebleu_test_set wmt14 --language_pair en-de \
        --num_beams 4 --length_penalty 0.6 --early_stopping never --tokenized_bleu 13a \
        --output_dir "$OUT_DIR/eval"
fi
