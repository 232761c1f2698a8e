# Sourced by fleet_h200.sh and client_check_h200.sh, after device_env.sh: the fleet they
# run, as loadtest.fleet_bench's (and loadtest.client_check's) flags in FLEET_ARGS, its
# served model in FLEET_MODEL and its tokenizer in FLEET_TOKENIZER.
#
# On the GPU: PREFILL (2) prefill and DECODE (2) decode workers of the Qwen3-8B shape with
# its EAGLE3 drafter (K=3, random weights, the shipped tokenizer's 4,096-token vocabulary),
# all on GPU 0, eager (CUDA graphs and compilation cost 105-300 s of start-up per engine,
# more than a call can spare), the KV pushed (on one GPU a pull goes over TCP), each
# engine's KV cache cut to KV_BLOCKS (2048) blocks of 16 tokens and given in bytes, so no
# engine profiles the GPU's memory and `pdspec up` starts all four at once.
# On a dry run (device_env.sh's DRY_RUN): the local model pair (MODELS_DIR, default
# ~/.cache/pdspec/models), KV_BLOCKS 66 of 32 tokens (vLLM's CPU attention takes multiples
# of 32; 2,112 tokens a worker: one 2,048-token sequence fits), nothing for the GPU.
# BASE_PORT, when set, moves every port: pdspec up's proxy on it, the fronts after it, the
# prefill workers at +100, the decode workers at +200, side channels at +600, KV events at
# +650 (unset: fleet_bench's defaults, 8000 and on).
PREFILL=${PREFILL:-2} DECODE=${DECODE:-2}
FLEET_PORTS=()
if [ -n "${BASE_PORT:-}" ]; then
  FLEET_PORTS=(--base-port "$BASE_PORT" --prefill-port $((BASE_PORT + 100)) --decode-port $((BASE_PORT + 200))
    --side-channel-port $((BASE_PORT + 600)) --kv-events-port $((BASE_PORT + 650)))
fi
if [ -n "${DRY_RUN:-}" ]; then
  MODELS_DIR=${MODELS_DIR:-$HOME/.cache/pdspec/models}
  KV_BLOCKS=${KV_BLOCKS:-66}
  FLEET_MODEL=pdspec-tiny FLEET_TOKENIZER=$MODELS_DIR/target
  FLEET_ARGS=(--model "$FLEET_MODEL" --prefill-replicas "$PREFILL" --decode-replicas "$DECODE"
    --kv-blocks "$KV_BLOCKS" --block-size 32 "${FLEET_PORTS[@]}"
    --up-args "--model.models_dir $MODELS_DIR --ready_timeout_s 600 --restart never")
  return 0
fi
KV_BLOCKS=${KV_BLOCKS:-2048}
FLEET_MODEL=Qwen3-8B-dummy FLEET_TOKENIZER=deploy/shapes/qwen3-8b-v4096
UP="--model.target deploy/shapes/qwen3-8b-v4096 --model.drafter deploy/shapes/qwen3-8b-eagle3-v4096
 --model.method eagle3 --model.num_speculative_tokens 3 --model.served_model_name $FLEET_MODEL
 --model.max_model_len 8192 --model.kv_transfer push
 --prefill.cuda_visible_devices 0 --decode.cuda_visible_devices 0
 --prefill.gpu_memory_utilization 0.2 --decode.gpu_memory_utilization 0.2
 --prefill.enforce_eager --decode.enforce_eager
 --prefill.max_num_batched_tokens 2048 --decode.max_num_batched_tokens 2048
 --ready_timeout_s 300 --restart never"
# 151,552 bytes of KV a token: 37 layers (36 of the target, 1 of the drafter) x 8 KV heads x 128 x 2 (K, V) x 2 bytes.
FLEET_ARGS=(--model "$FLEET_MODEL" --prefill-replicas "$PREFILL" --decode-replicas "$DECODE"
  --kv-blocks "$KV_BLOCKS" --block-size 16 --kv-bytes-per-token 151552 "${FLEET_PORTS[@]}"
  --extra-vllm-args '["--load-format", "dummy"]' --up-args "$UP")
