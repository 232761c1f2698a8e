"""CPU seconds per process group of the running stack over one serve_bench phase."""

import json, subprocess, sys, time
import psutil

root = int(sys.argv[1])
out = sys.argv[2]
bench = sys.argv[3:]


def groups():
    found = {}
    for p in psutil.Process(root).children(recursive=True):
        try:
            name = " ".join(p.cmdline())[:200]
            t = p.cpu_times()
            found[p.pid] = (name, t.user + t.system)
        except psutil.NoSuchProcess:
            pass
    return found


before = groups()
t0 = time.time()
bench_proc = subprocess.run(bench, capture_output=True, text=True)
wall = time.time() - t0
after = groups()
rows = []
for pid, (name, cpu) in after.items():
    rows.append((round(cpu - before.get(pid, (name, 0.0))[1], 1), pid, name))
rows.sort(reverse=True)
me = psutil.Process().cpu_times()
print(json.dumps({"wall_s": round(wall, 1), "rows": rows[:12]}, indent=1))
open(out, "w").write(json.dumps({"wall_s": round(wall, 1), "rows": rows}, indent=1))
