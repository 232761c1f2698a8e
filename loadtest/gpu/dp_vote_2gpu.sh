#!/usr/bin/env bash
# The data-parallel vote on the lent 2 x H200 (kind nvidia-h200-x2), one device call
# after gpu-stage installed vLLM 0.33 into /tmp/site and loadtest/gpu/stage_nccl.sh put a
# newer NCCL in /tmp/nccl (an MoE model's data parallelism needs NCCL >= 2.29.7 in vLLM
# 0.33; torch's there is older). Run from the repository root:
#
#   bash loadtest/gpu/dp_vote_2gpu.sh
#
# A prefill worker with data parallelism 2 over both GPUs: Qwen3-30B-A3B shape (MoE: only
# an MoE model's ranks step together and vote; a dense model's are independent engines)
# with random weights, EAGLE3 K=3, eager (a short start). It runs twice, one after the
# other: with pdspec's idle-rank vote, then with vLLM's own (`--no-worker.dp_idle_rank_vote`).
# Each run gets 16 prefill requests (4,096 tokens, max_tokens 1) one at a time, so one of
# its ranks is always idle; loadtest/serving/dp_vote.py reads the counters around them.
# Expected: with the vote, runner K=0 steps == runner steps; without it, fewer.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dp-vote-out}
RUN_ROOT=/tmp/pdspec-dp-vote
DEADLINE=$((SECONDS + ${BUDGET_S:-540}))  # the device call's limit is 600 s
source loadtest/gpu/device_env.sh 2
mkdir -p "$OUT" "$RUN_ROOT"
profile=deploy/profiles/dummy/qwen3-30b-a3b-eagle3-prefill-dp2.toml
url=http://127.0.0.1:8100

run_one() {  # NAME VOTE_FLAG
  # Its own session, so the whole process tree (API server, engine cores) ends with it.
  setsid python3 -m pdspec.cli --config $profile prefill "$2" --run_dir "$RUN_ROOT/$1" \
    > "$RUN_ROOT/$1.log" 2>&1 &
  local pid=$! code=1
  until curl -sf -m 2 "$url/health" > /dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "$1: worker exited during start" >&2; break; fi
    if [ $SECONDS -ge $DEADLINE ]; then echo "$1: not ready before the deadline" >&2; break; fi
    sleep 1
  done
  if curl -sf -m 2 "$url/health" > /dev/null; then
    echo "$1: ready after ${SECONDS}s"
    timeout -k 5 $((DEADLINE - SECONDS > 10 ? DEADLINE - SECONDS : 10)) \
      python3 -m loadtest.dp_vote --worker "$1=$url" --requests 16 --prompt-tokens 4096 --out "$OUT/$1"
    code=$?
  fi
  kill -- "-$pid" 2>/dev/null
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 -- "-$pid" 2>/dev/null
  { echo "=== $1"; grep -E 'ERROR|Error|Traceback|pdspec|[Dd]ata.parallel' "$RUN_ROOT/$1.log" | tail -30
    tail -10 "$RUN_ROOT/$1.log"; } >> "$OUT/logs.txt" 2>&1
  return $code
}

run_one vote --worker.dp_idle_rank_vote; vote=$?
run_one no-vote --no-worker.dp_idle_rank_vote; no_vote=$?
# One table and plot of both arms (each measured in its own run).
python3 -m loadtest.dp_vote --combine "$OUT/vote" "$OUT/no-vote" --out "$OUT"
(cd "$RUN_ROOT" && tar czf "$OUT/logs.tar.gz" ./*.log)
ls -laR "$OUT"
[ $vote = 0 ] && [ $no_vote = 0 ]
