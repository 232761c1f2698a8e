"""Two NIXL agents in two processes on this machine: how long one KV-pull-sized READ takes.

    python -m loadtest.micro.nixl_read_bench target DELAY_US /tmp/x &   # holds the bytes
    python -m loadtest.micro.nixl_read_bench init DELAY_US /tmp/x       # reads them, prints times

DELAY_US is the agent's progress-thread delay (pdspec's `nixl_progress_delay_us`; -1 keeps
nixl's 0). Environment: SIZE (bytes, default 2,621,440: a 512-token pull of the local model
pair in float32), REPS, NT (nixl `num_threads`; vLLM uses 4), POLL=1 (the target calls
`get_new_notifs` in a loop, like a prefill engine stepping while it holds finished blocks),
WARMFILE (the initiator creates it after the first READ and waits 1 s: lets a caller stop
the target, e.g. with SIGSTOP, to see whether a READ needs the target to run),
XFER_TIMEOUT (seconds). Pin either side with `taskset`. The metadata goes through PATH.
"""

from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np

from pdspec.worker.nixl_progress import apply_progress_delay

NUM_DESCRIPTORS = 5  # what vLLM's pull of one 512-token request used (vllm:nixl_num_descriptors)


def main() -> None:
    role, delay, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    size = int(os.environ.get("SIZE", 2621440))
    if delay >= 0:
        apply_progress_delay(delay)
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(num_threads=int(os.environ.get("NT", 0)), capture_telemetry=True)
    agent = nixl_agent(role, config)
    buf = np.ones(size, dtype=np.uint8) if role == "target" else np.zeros(size, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    chunk = size // NUM_DESCRIPTORS
    descs = agent.get_xfer_descs([(buf.ctypes.data + i * chunk, chunk, 0) for i in range(NUM_DESCRIPTORS)], "DRAM")
    if role == "target":
        serve(agent, descs, path)
    else:
        read(agent, descs, path, buf, size)


def serve(agent, descs, path: str) -> None:
    with open(path + ".tmp", "wb") as f:
        pickle.dump((agent.get_agent_metadata(), agent.get_serialized_descs(descs)), f)
    os.replace(path + ".tmp", path)
    end, poll = time.time() + 60, os.environ.get("POLL")
    while time.time() < end and not os.path.exists(path + ".done"):
        if poll:
            agent.get_new_notifs()
        else:
            time.sleep(0.05)  # an idle worker: only nixl's own threads run


def read(agent, descs, path: str, buf, size: int) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)  # the target writes its metadata once it is up
    with open(path, "rb") as f:
        meta, serialized = pickle.load(f)
    name = agent.add_remote_agent(meta)
    remote = agent.deserialize_descs(serialized)
    for i in range(int(os.environ.get("REPS", 5))):
        if i == 1 and os.environ.get("WARMFILE"):
            open(os.environ["WARMFILE"], "w").close()
            time.sleep(1)
        started = time.perf_counter()
        handle = agent.initialize_xfer("READ", descs, remote, name, b"done")
        agent.transfer(handle)
        deadline, polls = started + float(os.environ.get("XFER_TIMEOUT", 30)), 0
        while (state := agent.check_xfer_state(handle)) == "PROC" and time.perf_counter() < deadline:
            polls += 1
        elapsed_ms = (time.perf_counter() - started) * 1000
        agent.release_xfer_handle(handle)
        print(
            f"{state}: READ {size} B in {elapsed_ms:.1f} ms ({polls} polls), data ok={bool(buf[-1] == 1)}", flush=True
        )
    open(path + ".done", "w").close()


if __name__ == "__main__":
    main()
