# Sourced by the device scripts that run `pdspec up` in the background (handoff_h200.sh,
# one_gpu_admission_h200.sh): stopping the stack, and waiting for an endpoint. They set
# `up` (pdspec up's PID), RESULTS (its log is $RESULTS/up-log.txt) and, optionally,
# EXTRA_PIDS (processes of their own to stop first).

stop_stack() {  # pdspec up stops its children on SIGTERM; any left (each runs in its own session) by the PID it logged
  for pid in ${EXTRA_PIDS:-}; do kill -TERM "$pid" 2>/dev/null; done
  kill -TERM "$up" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$up" 2>/dev/null || break; sleep 0.5; done
  for pid in $up $(grep -o 'pid [0-9]*' "$RESULTS/up-log.txt" | cut -d' ' -f2); do
    kill -0 "$pid" 2>/dev/null && { echo "left running: $pid"; kill -KILL -- "-$pid" 2>/dev/null; }
  done
}

wait_ready() {  # URL PATH LIMIT_S: polls URL+PATH for a 200 until LIMIT_S, or until pdspec up exits
  python3 - "$1" "$2" "$3" "$up" <<'PY'
import sys, time, os, httpx
url, path, limit, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
t0 = time.monotonic()
while time.monotonic() - t0 < limit:
    try:
        if httpx.get(url + path, timeout=2).status_code == 200:
            print(f"{url} ready after {time.monotonic() - t0:.0f} s"); sys.exit(0)
    except httpx.HTTPError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        print("pdspec up exited before ready"); sys.exit(1)
    time.sleep(1)  # readiness poll interval
print(f"{url} not ready in time"); sys.exit(1)
PY
}
