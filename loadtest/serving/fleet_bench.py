"""Fleet benchmark: routing policies and conditional disaggregation side by side on one
xPyD fleet, under a QPS sweep from idle past saturation, on a trace written to disk.

    python -m loadtest.fleet_bench --out DIR --trace DIR/shared_context.json.gz \
      [--start-fleet --prefill-replicas 2 --decode-replicas 2 --kv-blocks 2048 --block-size 16 ...]
      [--jobs shared_context:kv_aware,shared_context:round_robin,...] [--deadline-s 540]

The fleet: `pdspec up` with `--prefill-replicas` prefill and `--decode-replicas` decode
workers, each KV cache cut to `--kv-blocks` blocks of `--block-size` tokens (vLLM's
`--num-gpu-blocks-override`; on a GPU also `--kv-cache-memory-bytes`, so no engine profiles
the GPU's memory and the engines start together: `pdspec up` starts workers of a given KV
size side by side), or one already running (`--attach`). In front of the same workers,
one proxy per pdspec policy, and vLLM's Rust router with `--vllm-router CMD`:
- `round_robin`, `least_outstanding`, `prefix_affinity` (pdspec's default), `kv_aware`
  (both pools), `kv_aware_prefill` (kv_aware on the prefill pool, least_outstanding on the
  decode pool), `kv_aware_conditional` (kv_aware with conditional disaggregation, without
  the pending count that is the default since 2026-12-06: the job as recorded), and its
  decode_full variants `kv_aware_conditional_full80` (`decode_full_share` 0.8) and
  `kv_aware_conditional_pending` (`decode_full_counts_pending`: the default rule), and that with
  `decode_full_prefill_share` 0.75, `kv_aware_conditional_pending_p75`;
- `colocated_kv_aware`: every worker, prefill and decode alike, as a colocated server
  behind kv_aware: its decode pool is the whole fleet and every prompt is prefilled where
  it is decoded (conditional disaggregation with no length limit), so the same engines on
  the same GPU share serve without disaggregation;
- `vllm_router_cache_aware`: vLLM's router in its P/D mode, `cache_aware` on both pools.

A job is one workload's trace through one policy. Before each job every worker's prefix
cache is reset (vLLM's `/reset_prefix_cache`, served with VLLM_SERVER_DEV_MODE=1), so every
policy meets the same requests from the same (empty) caches; then the trace's warm-up phase
(unmeasured: it fills the caches) and its levels in order. A level's requests leave at their
trace times (open loop); those still running `--drain-s` after its last arrival are cut
(counted as failed). Before and after each level every worker's /metrics is read: vLLM's
prompt tokens by source (recomputed = `local_compute`), prefix-cache hits and queries,
speculative-decoding drafts and accepted tokens, preemptions.

Jobs run in the order given while time is left: a job starts only when the time its
predecessors took on average fits before `--deadline-s` (seconds after this tool started);
the others are recorded as skipped. `fleet_bench.json` (and the requests of each job,
`requests-<workload>-<policy>.jsonl`) are written after every job, so a run cut short keeps
what it measured. `python -m loadtest.fleet_report` turns them into tables and plots.

Failure policy: a policy whose proxy does not come up is recorded as failed and the others
run; a request that fails is counted (and its error kept), never retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.serving.fleet_trace import FIRST_TOKEN_ID, Trace, TraceRequest, read_trace
from loadtest.serving.serve_client import stream_completion
from loadtest.serving.serve_stats import RequestResult
from pdspec.settings import RoutingSettings
from proxy.routing.kv_router import KvRouter

POLICIES: dict[str, dict] = {
    "round_robin": {"routing": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}},
    "least_outstanding": {"routing": {"prefill_policy": "least_outstanding", "decode_policy": "least_outstanding"}},
    "prefix_affinity": {"routing": {"prefill_policy": "prefix_affinity", "decode_policy": "least_outstanding"}},
    "kv_aware": {"routing": {"prefill_policy": "kv_aware", "decode_policy": "kv_aware"}},
    "kv_aware_prefill": {"routing": {"prefill_policy": "kv_aware", "decode_policy": "least_outstanding"}},
    # The rule without the pending count (on by default since 2026-12-06): the job's meaning
    # in every recorded run.
    "kv_aware_conditional": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "decode_full_counts_pending": False,
        }
    },
    # decode_full acting before a decode worker is quite full (the proxy's count misses
    # parked prefill KV and the generated tokens).
    "kv_aware_conditional_full80": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "decode_full_share": 0.8,
            "decode_full_counts_pending": False,
        }
    },
    # decode_full also counting the prompts planned disaggregated whose decode legs have not
    # started (their prefill legs run), which no decode worker's count holds yet: the
    # default since the H100 runs (loadtest/results/fleet/h100-qwen3-8b/).
    "kv_aware_conditional_pending": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "decode_full_counts_pending": True,
        }
    },
    # ...and a prefill worker taking requests whole only within 0.75 of its KV, keeping room
    # for its prefill legs (at 1, round 5's prefill legs took 1.6-3.6 s on prefill workers
    # whose count left 2.3k tokens of room for a 4.4k prompt).
    "kv_aware_conditional_pending_p75": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "decode_full_counts_pending": True,
            "decode_full_prefill_share": 0.75,
        }
    },
    "colocated_kv_aware": {
        "routing": {
            "prefill_policy": "kv_aware",
            "decode_policy": "kv_aware",
            "disaggregation": "conditional",
            "local_prefill_max_tokens": 10**9,
        }
    },
}
COLOCATED = "colocated_kv_aware"
# The policies whose proxy keeps a cache index (subscribed to every worker's KV events), by
# the proxy's own rule.
INDEXED = tuple(name for name, config in POLICIES.items() if KvRouter.wanted(RoutingSettings(**config["routing"])))
VLLM_ROUTER = "vllm_router_cache_aware"
ALL_POLICIES = (*POLICIES, VLLM_ROUTER)

# Counters read from every worker, by (name, label to keep or None).
SOURCE_COUNTER = "vllm:prompt_tokens_by_source_total"
WORKER_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
)
PROXY_LOCAL_PREFILLS = "pdspec_proxy_local_prefills_total"


# --- the fleet -----------------------------------------------------------------------------


def fleet_urls(args) -> dict[str, list[str]]:
    return {
        "prefill": [f"http://127.0.0.1:{args.prefill_port + i}" for i in range(args.prefill_replicas)],
        "decode": [f"http://127.0.0.1:{args.decode_port + i}" for i in range(args.decode_replicas)],
    }


def worker_vllm_args(args) -> list[str]:
    """Each worker's extra vLLM arguments: its KV cache cut to --kv-blocks blocks, given in
    bytes too where the size of a block is known (a GPU: no memory profile)."""
    extra = json.loads(args.extra_vllm_args)
    extra += ["--num-gpu-blocks-override", str(args.kv_blocks), "--block-size", str(args.block_size)]
    if args.kv_bytes_per_token:
        # The cache's bytes, a block over (vLLM keeps one block back: the null block).
        size = (args.kv_blocks + 1) * args.block_size * args.kv_bytes_per_token
        extra += ["--kv-cache-memory-bytes", str(size)]
    return extra


def up_argv(args) -> list[str]:
    extra = json.dumps(worker_vllm_args(args))
    return [
        sys.executable,
        "-m",
        "pdspec.cli",
        "up",
        "--run_dir",
        str(args.run_dir),
        "--prefill.replicas",
        str(args.prefill_replicas),
        "--decode.replicas",
        str(args.decode_replicas),
        "--prefill.port",
        str(args.prefill_port),
        "--decode.port",
        str(args.decode_port),
        "--proxy.port",
        str(args.base_port),
        "--prefill.side_channel_port",
        str(args.side_channel_port),
        "--decode.side_channel_port",
        str(args.side_channel_port + 4 * args.prefill_replicas),
        "--prefill.kv_events_port",
        str(args.kv_events_port),
        "--decode.kv_events_port",
        str(args.kv_events_port + 2 * args.prefill_replicas),
        "--prefill.extra_vllm_args",
        extra,
        "--decode.extra_vllm_args",
        extra,
        *shlex.split(args.up_args),
    ]


def start_fleet(args) -> tuple[subprocess.Popen, float]:
    """`pdspec up`, its output in run_dir/pdspec-up.log; returns once it is ready, and how long that took."""
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log = open(args.run_dir / "pdspec-up.log", "w")  # noqa: SIM115 (open while it runs)
    started = time.monotonic()
    process = subprocess.Popen(up_argv(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        log.flush()
        print(line.rstrip(), flush=True)
        if line.startswith("pdspec up: ready:"):
            break
    else:
        raise SystemExit(f"pdspec up exited before it was ready ({process.wait()})")

    def drain() -> None:  # keep reading its output, or it blocks on a full pipe
        for rest in process.stdout:
            log.write(rest)
        log.close()

    import threading

    threading.Thread(target=drain, daemon=True).start()
    return process, time.monotonic() - started


def stop_fleet(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(2)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


# --- the policies' front ends ----------------------------------------------------------------


def policy_settings(name: str, workers: dict[str, list[str]], port: int, kv_source_ports: str) -> dict:
    decode = workers["prefill"] + workers["decode"] if name == COLOCATED else workers["decode"]
    return {
        "port": port,
        "prefill_urls": workers["prefill"],
        "decode_urls": decode,
        **POLICIES[name],
        "kv_transfer": {"source_ports": [kv_source_ports]},
        "observability": {"served_by_headers": True},
    }


def vllm_router_argv(command: str, port: int, workers: dict[str, list[str]]) -> list[str]:
    argv = [
        *shlex.split(command),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "nixl",
        "--policy",
        "cache_aware",
        "--prometheus-port",
        str(port + 1000),
    ]
    for url in workers["prefill"]:
        argv += ["--prefill", url]
    for url in workers["decode"]:
        argv += ["--decode", url]
    return argv


def start_front_ends(args, policies: list[str], workers: dict, out: Path) -> dict[str, dict]:
    """One proxy per pdspec policy (and vLLM's router), each on its own port; waits for
    them. A front end that exits or is not ready in time is recorded, not fatal."""
    fronts: dict[str, dict] = {}
    first = args.side_channel_port
    last = args.side_channel_port + 4 * (args.prefill_replicas + args.decode_replicas) + 3
    for i, name in enumerate(policies, start=1):
        port = args.base_port + i
        log = open(out / f"front-{name}.log", "w")  # noqa: SIM115 (open while it runs)
        if name == VLLM_ROUTER:
            argv, env, ready = vllm_router_argv(args.vllm_router, port, workers), dict(os.environ), "/health"
        else:
            settings = policy_settings(name, workers, port, f"{first}-{last}")
            argv, ready = [sys.executable, "-m", "pdspec.cli", "proxy"], "/ready"
            env = {**os.environ, "PDSPEC_PROXY": json.dumps(settings)}
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        fronts[name] = {"process": process, "url": f"http://127.0.0.1:{port}", "ready_path": ready, "error": None}
    deadline = time.monotonic() + 120
    for front in fronts.values():
        while True:
            try:
                if httpx.get(front["url"] + front["ready_path"], timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if front["process"].poll() is not None or time.monotonic() > deadline:
                front["error"] = f"not ready (exit {front['process'].poll()})"
                break
            time.sleep(0.5)  # polling its readiness endpoint, the check itself
    return fronts


def stop_front_ends(fronts: dict[str, dict]) -> None:
    for front in fronts.values():
        if front["process"].poll() is None:
            front["process"].terminate()
    for front in fronts.values():
        try:
            front["process"].wait(timeout=30)
        except subprocess.TimeoutExpired:
            front["process"].kill()


# --- the workers' state ------------------------------------------------------------------------


def read_counters(url: str) -> dict[str, float]:
    """The worker's counters this tool reports, summed over label sets, with vLLM's prompt
    tokens by source kept apart (`source:<name>`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SOURCE_COUNTER:
                key = "source:" + sample.labels.get("source", "")
                values[key] = values.get(key, 0.0) + sample.value
            elif sample.name in WORKER_COUNTERS:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def read_fleet(workers: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    return {url: read_counters(url) for urls in workers.values() for url in urls}


def fleet_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    return {
        url: {k: after[url].get(k, 0.0) - before[url].get(k, 0.0) for k in set(before[url]) | set(after[url])}
        for url in after
    }


def proxy_counter(front: dict, name: str) -> dict[tuple, float]:
    """A pdspec front's counter, by its samples' labels (sorted pairs); empty when it has
    none or is not a pdspec front."""
    if front["ready_path"] != "/ready":  # vLLM's router has none of pdspec's counters
        return {}
    try:
        text = httpx.get(front["url"] + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def local_prefills(front: dict) -> tuple[float, float]:
    """(requests served without a prefill leg, of those the ones a prefill worker served
    whole: conditional disaggregation's decode_full), from one read of the front's counter."""
    counts = proxy_counter(front, PROXY_LOCAL_PREFILLS)
    return sum(counts.values()), counts.get((("reason", "decode_full"),), 0.0)


def reset_caches(workers: dict[str, list[str]], model: str, timeout_s: float = 60.0) -> dict:
    """Every worker's prefix cache emptied (retried while blocks are still held), then one
    tiny request to each, so its engine steps and publishes the AllBlocksCleared event the
    proxies' indexes forget it on. Returns how long it took and any worker that refused: a
    404 at once (vLLM serves the endpoint only with VLLM_SERVER_DEV_MODE=1), the others
    once `timeout_s` has passed."""
    started = time.monotonic()
    refused = []
    with httpx.Client(timeout=30) as client:
        for url in (u for urls in workers.values() for u in urls):
            while True:
                reply = client.post(url + "/reset_prefix_cache")
                if reply.status_code == 200 and reply.json().get("success"):
                    break
                if reply.status_code == 404:
                    refused.append(f"{url}: 404: not served (the worker needs VLLM_SERVER_DEV_MODE=1)")
                    break
                if time.monotonic() - started > timeout_s:
                    refused.append(f"{url}: {reply.status_code} {reply.text[:120]}")
                    break
                time.sleep(0.5)  # blocks still held by a request finishing: vLLM says retry
            client.post(url + "/v1/completions", json={"model": model, "prompt": [FIRST_TOKEN_ID], "max_tokens": 1})
    return {"reset_s": time.monotonic() - started, "refused": refused}


def cleared_events(front: dict) -> float:
    """How many AllBlocksCleared events a pdspec proxy's cache index has applied
    (`pdspec_proxy_kv_events_total{kind="cleared"}`; 0 without an index)."""
    if front["ready_path"] != "/ready":
        return 0.0
    text = httpx.get(front["url"] + "/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "pdspec_proxy_kv_events_total" and s.labels.get("kind") == "cleared"
    )


def wait_index_cleared(front: dict, before: float, workers: int, timeout_s: float = 15.0) -> bool:
    """The proxy's cache index applied one AllBlocksCleared more per worker than `before`
    (the reset's, so it forgot every worker's blocks). Read from the event counter: a worker
    that held nothing before the reset shows no change in `pdspec_proxy_kv_index_blocks`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cleared_events(front) >= before + workers:
            return True
        time.sleep(0.2)  # polling the counter, the check itself
    return False


# --- running a trace -----------------------------------------------------------------------------


def body_of(trace: Trace, request: TraceRequest, model: str) -> dict:
    return {
        "model": model,
        "prompt": trace.prompt(request),
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_phase(
    url: str, trace: Trace, requests: list[TraceRequest], model: str, drain_s: float, timeout_s: float
) -> tuple[list[dict], float]:
    """The phase's requests at their trace times (a later turn: after its previous turn's
    reply and its pause). Returns one record per request (cut ones failed) and the window,
    first send to last reply (or the cut)."""
    records: dict[int, dict] = {}
    finished = {r.id: asyncio.Event() for r in requests}
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        started = time.perf_counter()

        async def one(request: TraceRequest) -> None:
            try:
                if request.after is not None and request.after in finished:
                    await finished[request.after].wait()
                    await asyncio.sleep(request.think_s)
                else:
                    await asyncio.sleep(max(0.0, started + request.at_s - time.perf_counter()))
                sent = time.perf_counter() - started
                records[request.id] = {"sent_s": sent, "cut": True}
                result = await stream_completion(client, url, body_of(trace, request, model))
                records[request.id] = {"sent_s": sent, "done_s": time.perf_counter() - started, **record(result)}
            finally:
                finished[request.id].set()

        tasks = [asyncio.create_task(one(r)) for r in requests]
        last_arrival = max((r.at_s for r in requests), default=0.0)
        # Sessions' later turns have no trace time: the drain limit counts from the last first turn.
        _, pending = await asyncio.wait(tasks, timeout=last_arrival + drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        window = time.perf_counter() - started
    rows = []
    for request in requests:
        row = records.get(request.id, {"sent_s": None, "cut": True})
        if row.get("cut"):
            row = {**row, "ok": False, "error": f"cut: still running {drain_s:.0f} s after the last arrival"}
        rows.append(
            {
                "id": request.id,
                "phase": request.phase,
                "group": request.group,
                "turn": request.turn,
                "prompt_tokens": sum(len(trace.segments[n]) for n in request.segments),
                **row,
            }
        )
    return rows, window


def record(result: RequestResult) -> dict:
    return {
        "ok": result.ok,
        "error": result.error or None,
        "output_tokens": result.output_tokens,
        "ttft_s": result.ttft_s if result.ok else None,
        "tpot_s": result.tpot_s if result.ok else None,
        "e2e_s": result.e2e_s if result.ok else None,
        "phases_ms": result.phases_ms,
        "served_by": result.served_by,
        "cut": False,
    }


def run_job(args, trace: Trace, policy: str, front: dict, workers: dict) -> dict:
    """One trace through one policy: reset, warm-up, each level measured."""
    job: dict = {"workload": trace.name, "kind": trace.workload, "policy": policy, "started_at": time.time()}
    t0 = time.monotonic()
    indexed = policy in INDEXED
    before = cleared_events(front) if indexed else 0.0
    job["reset"] = reset_caches(workers, args.model)
    count = sum(len(urls) for urls in workers.values())
    job["reset"]["index_cleared"] = wait_index_cleared(front, before, count) if indexed else None
    rows_all: list[dict] = []
    job["levels"] = []
    for phase in trace.phases():
        requests = trace.phase(phase)
        before = read_fleet(workers)
        local_before, whole_before = local_prefills(front)
        rows, window = asyncio.run(
            run_phase(front["url"], trace, requests, args.model, args.drain_s, args.request_timeout_s)
        )
        after = read_fleet(workers)
        local_after, whole_after = local_prefills(front)
        level = {
            "phase": phase,
            "qps": requests[0].qps,
            "window_s": window,
            "requests": len(rows),
            "workers": fleet_delta(before, after),
            # Prefilled on their decode worker, and served whole on a prefill worker (decode_full).
            "local_prefills": (local_after - whole_after) - (local_before - whole_before),
            "whole_on_prefill": whole_after - whole_before,
        }
        rows_all += rows
        if phase == "warmup":
            job["warmup"] = {**level, "failed": sum(not r["ok"] for r in rows)}
        else:
            job["levels"].append(level)
        print(
            f"fleet_bench: {trace.name} {policy} {phase} qps {level['qps']:g}: "
            f"{sum(r['ok'] for r in rows)}/{len(rows)} ok in {window:.1f} s",
            flush=True,
        )
    job["duration_s"] = time.monotonic() - t0
    with open(args.out / f"requests-{trace.name}-{policy}.jsonl", "w") as out:
        for row in rows_all:
            out.write(json.dumps(row) + "\n")
    return job


def parse_jobs(spec: str, traces: dict[str, Trace]) -> list[tuple[str, str]]:
    jobs = []
    for item in (part.strip() for part in spec.split(",") if part.strip()):
        workload, sep, policy = item.partition(":")
        if not sep or workload not in traces or policy not in ALL_POLICIES:
            raise SystemExit(
                f"--jobs: {item!r}: expected WORKLOAD:POLICY with WORKLOAD one of {sorted(traces)} "
                f"and POLICY one of {', '.join(ALL_POLICIES)}"
            )
        jobs.append((workload, policy))
    return jobs


def save(args, report: dict) -> None:
    (args.out / "fleet_bench.json").write_text(json.dumps(report, indent=1) + "\n")


def run(args) -> dict:
    began = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    traces = {t.name: t for t in (read_trace(path) for path in args.trace)}
    jobs = parse_jobs(args.jobs, traces)
    policies = list(dict.fromkeys(policy for _, policy in jobs))
    if VLLM_ROUTER in policies and not args.vllm_router:
        raise SystemExit(f"{VLLM_ROUTER} needs --vllm-router CMD")
    workers = fleet_urls(args)
    report: dict = {
        "command": "python -m loadtest.fleet_bench " + " ".join(args.argv),
        "workers": workers,
        "kv_blocks": args.kv_blocks,
        "block_size": args.block_size,
        "model": args.model,
        "traces": {
            w: {"workload": t.workload, "settings": t.settings, "requests": len(t.requests)} for w, t in traces.items()
        },
        "jobs": [],
        "skipped": [],
    }
    up, fronts = None, {}
    try:
        if not args.attach:
            up, report["fleet_ready_s"] = start_fleet(args)
            print(f"fleet_bench: fleet ready after {report['fleet_ready_s']:.0f} s", flush=True)
        report["fleet_blocks"] = fleet_blocks(workers)
        report["gpu_memory"] = gpu_memory()
        t = time.monotonic()
        fronts = start_front_ends(args, policies, workers, args.out)
        report["front_ends_ready_s"] = time.monotonic() - t
        save(args, report)
        durations: list[float] = []
        for workload, policy in jobs:
            left = args.deadline_s - (time.monotonic() - began)
            expected = sum(durations) / len(durations) if durations else 0.0
            if fronts[policy]["error"] or left < expected * 1.05:
                reason = fronts[policy]["error"] or f"out of time: {left:.0f} s left, a job takes about {expected:.0f}"
                report["skipped"].append({"workload": workload, "policy": policy, "reason": reason})
                print(f"fleet_bench: skipped {workload} {policy}: {reason}", flush=True)
                save(args, report)
                continue
            job = run_job(args, traces[workload], policy, fronts[policy], workers)
            durations.append(job["duration_s"])
            report["jobs"].append(job)
            save(args, report)
    finally:
        stop_front_ends(fronts)
        stop_fleet(up)
    report["total_s"] = time.monotonic() - began
    save(args, report)
    return report


def gpu_memory() -> str | None:
    """nvidia-smi's memory reading with the fleet up (None without a GPU)."""
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def fleet_blocks(workers: dict[str, list[str]]) -> dict[str, float | None]:
    """Each worker's KV blocks as vLLM reports them (vllm:cache_config_info's num_gpu_blocks)."""
    blocks = {}
    for url in (u for urls in workers.values() for u in urls):
        found = None
        text = httpx.get(url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("vllm:cache_config_info") and "num_gpu_blocks" in sample.labels:
                    try:
                        found = float(sample.labels["num_gpu_blocks"])
                    except ValueError:
                        pass
        blocks[url] = found
    return blocks


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet's flags (what start_fleet starts, or where --attach finds it), shared with
    loadtest.client_check."""
    parser.add_argument("--model", default="pdspec-tiny", help="the served model name")
    parser.add_argument("--attach", action="store_true", help="use a fleet already running on these ports")
    parser.add_argument("--run-dir", type=Path, default=Path.home() / ".cache" / "pdspec" / "fleet-bench")
    parser.add_argument("--prefill-replicas", type=int, default=2)
    parser.add_argument("--decode-replicas", type=int, default=2)
    parser.add_argument(
        "--base-port", type=int, default=8000, help="pdspec up's proxy; the policies' front ends follow"
    )
    parser.add_argument("--prefill-port", type=int, default=8100)
    parser.add_argument("--decode-port", type=int, default=8200)
    parser.add_argument("--side-channel-port", type=int, default=5600, help="the first NIXL side channel (4 a worker)")
    parser.add_argument("--kv-events-port", type=int, default=5650, help="the first KV-event port (2 a worker)")
    parser.add_argument("--kv-blocks", type=int, required=True, help="KV blocks per worker")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=0,
        help="a token's KV in bytes over all layers, "
        "the drafter's included (GPU: also passed as --kv-cache-memory-bytes); 0: not passed",
    )
    parser.add_argument("--extra-vllm-args", default="[]", help="more vLLM arguments for every worker (JSON list)")
    parser.add_argument("--up-args", default="", help="more `pdspec up` arguments, as one string")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.fleet_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        required=True,
        help="a trace from `python -m loadtest.fleet_trace` (one per workload; repeat)",
    )
    parser.add_argument(
        "--jobs", required=True, help="WORKLOAD:POLICY,... in the order to run; policies: " + ", ".join(ALL_POLICIES)
    )
    add_fleet_arguments(parser)
    parser.add_argument("--vllm-router", metavar="CMD", help="vLLM's router command (e.g. 'vllm-router')")
    parser.add_argument(
        "--drain-s",
        type=float,
        default=20.0,
        help="a level's requests still running this long after its last arrival are cut (failed)",
    )
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=1e9,
        help="start no job that would end after this (seconds from this tool's start, by the jobs' mean so far)",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    report = run(args)
    print(
        f"fleet_bench: {len(report['jobs'])} jobs run, {len(report['skipped'])} skipped, {report['total_s']:.0f} s",
        flush=True,
    )
    return report


if __name__ == "__main__":
    main()
