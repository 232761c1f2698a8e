"""The CPU seconds each process under a running `pdspec up` used while a command ran (the
record of how cpu_seconds.json was taken).

`python cpu_share.py UP_PID OUT.json COMMAND...`
"""

import json
import subprocess
import sys
import time

import psutil


def cpu_by_process(root: int) -> dict[int, tuple[str, float]]:
    found = {}
    for process in psutil.Process(root).children(recursive=True):
        try:
            times = process.cpu_times()
            found[process.pid] = (" ".join(process.cmdline())[:200], times.user + times.system)
        except psutil.NoSuchProcess:
            pass
    return found


def main() -> None:
    root, out, command = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    before, started = cpu_by_process(root), time.time()
    subprocess.run(command, capture_output=True, text=True)
    wall, after = time.time() - started, cpu_by_process(root)
    rows = sorted(
        ((round(cpu - before.get(pid, (name, 0.0))[1], 1), pid, name) for pid, (name, cpu) in after.items()),
        reverse=True,
    )
    with open(out, "w") as file:
        json.dump({"wall_s": round(wall, 1), "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
