#!/bin/bash
source /work/main/.venv/bin/activate
cd /work/wt-xcheck
export VLLM_SERVER_DEV_MODE=1
R=/tmp/xcheck-run/res
for i in 2 3; do
  echo "round $i pdspec $(date -u +%T)"
  python -m loadtest.fleet_bench --out $R/pdspec-sc$i --trace /tmp/xcheck-run/sc$i.json.gz --jobs sc$i:prefix_affinity --attach --prefill-replicas 1 --decode-replicas 1 --base-port 18000 --prefill-port 18100 --decode-port 18200 --side-channel-port 18600 --kv-events-port 18650 --kv-blocks 13104 --block-size 16 --drain-s 60 > $R/pdspec-sc$i.log 2>&1
  echo "round $i vllm $(date -u +%T)"
  /tmp/xcheck-run/vb.sh ${i}1 1 vllm-r$i-rate1 > $R/vllm-r$i-rate1.log 2>&1
  /tmp/xcheck-run/vb.sh ${i}2 3 vllm-r$i-rate3 > $R/vllm-r$i-rate3.log 2>&1
done
echo "done $(date -u +%T)"
