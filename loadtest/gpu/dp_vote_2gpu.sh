#!/usr/bin/env bash
# The data-parallel vote on the lent 2 x H200 (kind nvidia-h200-x2), one device call
# after gpu-stage installed vLLM 0.33 into /tmp/site. Run from the repository root:
#
#   bash loadtest/gpu/dp_vote_2gpu.sh
#
# Two prefill workers start together, each with data parallelism 2 over both GPUs (40%
# of each), Qwen3-8B shape with random weights, EAGLE3 K=3, eager (a short start): one
# with pdspec's idle-rank vote, one with vLLM's own (`--no-worker.dp_idle_rank_vote`). Each
# then gets 16 prefill requests (4,096 tokens, max_tokens 1) one at a time, so one of
# its ranks is always idle. loadtest/dp_vote.py reads both workers' counters around them.
# Expected: with the vote, runner K=0 steps == runner steps; without it, fewer.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dp-vote-out}
RUN_ROOT=/tmp/pdspec-dp-vote
source loadtest/gpu/device_env.sh 2
mkdir -p "$OUT" "$RUN_ROOT"
profile=deploy/profiles/dummy/qwen3-8b-eagle3-prefill-dp2.toml

pids=()
start() {  # NAME PORT SIDE_CHANNEL_PORT VOTE_FLAG
  setsid python3 -m pdspec.cli --config $profile prefill --worker.port "$2" --worker.side_channel_port "$3" \
    "$4" --run_dir "$RUN_ROOT/$1" > "$RUN_ROOT/$1.log" 2>&1 &
  pids+=($!)
}
start vote 8100 5600 --worker.dp_idle_rank_vote
start no-vote 8300 5700 --no-worker.dp_idle_rank_vote

ready=0
for _ in $(seq 1 400); do  # up to 400 s for both engines
  ready=1
  for port in 8100 8300; do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null || ready=0
  done
  [ $ready = 1 ] && break
  sleep 1
done
code=1
if [ $ready = 1 ]; then
  python3 -m loadtest.dp_vote --worker vote=http://127.0.0.1:8100 --worker no-vote=http://127.0.0.1:8300 \
    --requests 16 --prompt-tokens 4096 --out "$OUT"
  code=$?
else
  echo "workers not ready in 400 s" >&2
fi

for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null; done  # each started in its own session
sleep 5
for pid in "${pids[@]}"; do kill -9 -- "-$pid" 2>/dev/null; done
for name in vote no-vote; do
  echo "=== $name"; grep -E 'ERROR|Error|Traceback|pdspec|data.parallel|DP' "$RUN_ROOT/$name.log" | tail -30
  tail -10 "$RUN_ROOT/$name.log"
done > "$OUT/logs.txt" 2>&1
ls -la "$OUT"
exit $code
