"""Where the 1P1D hand-off spends its time: one request at a time, stage by stage.

For each of `--requests` fresh random prompts (no prefix-cache hit helps) it measures:

- `proxy_ttft_ms`: time to the first streamed token through the proxy (what a client sees);
- `prefill_leg_ms`: the prefill worker alone, asked directly as the proxy asks it
  (`max_tokens` 1, `do_remote_decode`), to its whole response;
- `decode_pull_ttft_ms`: the decode worker alone, given that response's
  `kv_transfer_params` (NIXL pull + first step), to its first streamed token;
- `decode_local_ttft_ms`: the decode worker alone with no `kv_transfer_params`, so it
  prefills the prompt itself (what one worker on one core costs, prefill included);

with `--other-proxy-url` (a second proxy in front of the same workers, another setting:
without `proxy.kv_transfer.early_decode`, say), `other_proxy_ttft_ms` too, taken in the same loop so
that the two proxies' figures alternate;

and, from each worker's /metrics around each pulled leg (so the decode worker's local
prefills are left out; the prefill worker posts the transfer when the KV is pushed), vLLM's
own means: NIXL transfer time (`vllm:nixl_xfer_time_seconds`, post to
completion seen) and post time, queue time (`vllm:request_queue_time_seconds`, which
includes waiting for the pull) and the decode side's own prefill step.

`python -m loadtest.handoff_probe --proxy-url URL --prefill-url URL --decode-url URL`
prints the per-request rows and the medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.serving import worker_metrics
from loadtest.serving.serve_client import completion_body, random_prompts
from proxy.apis.legs import PREFILL_KV_REQUEST  # what the proxy sends the prefill worker

# vLLM's own histograms, each read as its mean over the pulled legs.
DECODE_HISTOGRAMS = {
    "nixl_xfer_time_mean_ms": "vllm:nixl_xfer_time_seconds",  # post to completion seen
    "nixl_post_time_mean_ms": "vllm:nixl_post_time_seconds",  # building and posting the transfer
    "request_queue_time_mean_ms": "vllm:request_queue_time_seconds",  # waiting, the pull included
    "request_prefill_time_mean_ms": "vllm:request_prefill_time_seconds",  # the decode side's first step
}


XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"


def scrape_after_transfer(
    client: httpx.Client, urls: dict[str, str], before: dict[str, dict[str, float]], timeout_s: float = 5.0
) -> dict[str, dict[str, float]]:
    """Each worker's metrics (`scrape_when_idle`) once a transfer past `before` is counted on
    either: the side that posts it (the decode worker pulling, the prefill worker pushing)
    reports it with its engine's next stats, which for a prefill worker idle after its leg
    came up to a second after the decode leg's first token (read at once, the pushed
    transfers were never counted: the H200 check of 2026-12-05 and a CPU push stack). After
    `timeout_s` with none counted, the metrics as they stand."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = {side: worker_metrics.scrape_when_idle(client, url) for side, url in urls.items()}
        counted = any(after[side].get(XFER_COUNT, 0.0) > before[side].get(XFER_COUNT, 0.0) for side in urls)
        if counted or time.monotonic() > deadline:
            return after
        time.sleep(0.05)  # poll interval


def first_token_ms(client: httpx.Client, url: str, body: dict, request_id: str | None = None) -> float:
    """Milliseconds to the first streamed event that carries text. The stream is read to
    its end (a few tokens), so the request finishes rather than being aborted: vLLM records
    a request's queue and prefill times only when it finishes."""
    started = time.perf_counter()
    first = None
    headers = {"X-Request-Id": request_id} if request_id else {}
    with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data:") and '"text"' in line:
                first = (time.perf_counter() - started) * 1000
    if first is None:
        raise RuntimeError(f"{url}: stream ended with no token")
    return first


def prefill_leg(client: httpx.Client, url: str, model: str, prompt: list[int], request_id: str) -> tuple[float, dict]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": PREFILL_KV_REQUEST,
    }
    started = time.perf_counter()
    # One X-Request-Id on both legs, as the proxy sends: a push prefill worker matches the
    # decode worker's registration to its finished request by that id.
    response = client.post(url + "/v1/completions", json=body, headers={"X-Request-Id": request_id})
    response.raise_for_status()
    elapsed = (time.perf_counter() - started) * 1000
    params = response.json().get("kv_transfer_params")
    if not params:
        raise RuntimeError(f"{url}: prefill response has no kv_transfer_params")
    return elapsed, params


def probe(
    client: httpx.Client,
    proxy_url: str,
    prefill_url: str,
    decode_url: str,
    model: str,
    requests: int,
    input_len: int = 512,
    max_tokens: int = 4,
    vocab_size: int = 4096,
    seed: int = 0,
    other_proxy_url: str | None = None,
) -> dict:
    """Run the four measurements per request (five with `other_proxy_url`), one request
    in flight at a time."""
    per_request = 4 if other_proxy_url else 3
    prompts = random_prompts(per_request * requests, input_len, vocab_size, seed)
    proxy_before = proxy_legs(client, proxy_url)
    # Each worker's histograms over the pulled legs alone: the decode worker's, and the
    # prefill worker's, which posts the transfer when the KV is pushed (kv_transfer = push).
    pulls: dict[str, dict[str, float]] = {"decode": {}, "prefill": {}}
    rows = []
    for i in range(requests):
        via_proxy, direct, local, *via_other = prompts[per_request * i : per_request * (i + 1)]
        row = {"proxy_ttft_ms": first_token_ms(client, proxy_url, completion_body(model, via_proxy, max_tokens))}
        if other_proxy_url:
            row["other_proxy_ttft_ms"] = first_token_ms(
                client, other_proxy_url, completion_body(model, via_other[0], max_tokens)
            )
        request_id = f"handoff-probe-{seed}-{i}-{time.time_ns()}"
        row["prefill_leg_ms"], params = prefill_leg(client, prefill_url, model, direct, request_id)
        pulled = dict(completion_body(model, direct, max_tokens), kv_transfer_params=params)
        urls = {"decode": decode_url, "prefill": prefill_url}
        before = {side: worker_metrics.scrape_when_idle(client, url) for side, url in urls.items()}
        row["decode_pull_ttft_ms"] = first_token_ms(client, decode_url, pulled, request_id)
        after = scrape_after_transfer(client, urls, before)
        for side in urls:
            for name, value in after[side].items():
                pulls[side][name] = pulls[side].get(name, 0.0) + value - before[side].get(name, 0.0)
        row["decode_local_ttft_ms"] = first_token_ms(client, decode_url, completion_body(model, local, max_tokens))
        rows.append(row)
    proxy_after = proxy_legs(client, proxy_url)
    return {
        "input_len": input_len,
        "max_tokens": max_tokens,
        "rows": rows,
        "median": medians(rows),
        "decode_pull_metrics": metric_means({}, pulls["decode"]),
        "prefill_pull_metrics": metric_means({}, pulls["prefill"]),
        "proxy_leg_mean_ms": {
            leg: round(
                (proxy_after[leg][0] - proxy_before.get(leg, (0.0, 0.0))[0])
                / max(1.0, proxy_after[leg][1] - proxy_before.get(leg, (0.0, 0.0))[1])
                * 1000,
                1,
            )
            for leg in proxy_after
        },
    }


def proxy_legs(client: httpx.Client, proxy_url: str) -> dict[str, tuple[float, float]]:
    """The proxy's own leg histogram (`pdspec_proxy_leg_seconds`): {leg: (sum, count)}.
    Prefill: to its whole response; decode: to the last byte."""
    text = client.get(proxy_url + "/metrics", timeout=10).text
    legs: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            leg = sample.labels.get("leg")
            if family.name == "pdspec_proxy_leg_seconds" and leg and sample.name.endswith(("_sum", "_count")):
                legs.setdefault(leg, [0.0, 0.0])[0 if sample.name.endswith("_sum") else 1] = sample.value
    return {leg: (total, count) for leg, (total, count) in legs.items()}


def medians(rows: list[dict]) -> dict[str, float]:
    return {key: round(statistics.median(row[key] for row in rows), 1) for key in rows[0]}


def metric_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    def mean_ms(name: str) -> float | None:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        return round(total / count * 1000, 1) if count else None

    return {key: mean_ms(name) for key, name in DECODE_HISTOGRAMS.items()}


STAGES = ("proxy_ttft_ms", "prefill_leg_ms", "decode_pull_ttft_ms", "decode_local_ttft_ms")


def plot_stages(results: dict[str, dict], path: Path) -> None:
    """Median milliseconds of each stage, one group of bars per probe run (label: its JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(results))
    for i, (label, result) in enumerate(results.items()):
        values = [result["median"][stage] for stage in STAGES]
        bars = ax.bar([x + i * width for x in range(len(STAGES))], values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(
        [x + width * (len(results) - 1) / 2 for x in range(len(STAGES))],
        [stage.removesuffix("_ms").replace("_", " ") for stage in STAGES],
    )
    ax.set_ylabel("median ms")
    ax.set_title("1P1D hand-off, stage by stage (one request at a time)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--plot",
        nargs="+",
        metavar="LABEL=JSON",
        help="plot earlier runs' --out files side by side into --plot-out, and exit",
    )
    parser.add_argument("--plot-out", type=Path, default=Path("handoff_probe.png"))
    parser.add_argument("--proxy-url")
    parser.add_argument("--prefill-url")
    parser.add_argument("--decode-url")
    parser.add_argument("--other-proxy-url", help="a second proxy in front of the same workers, timed alternately")
    parser.add_argument("--model", default="pdspec-tiny")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--out", type=Path, help="also write the rows and medians here, as JSON")
    args = parser.parse_args(argv)
    if args.plot:
        runs = {label: json.loads(Path(file).read_text()) for label, _, file in (a.partition("=") for a in args.plot)}
        plot_stages(runs, args.plot_out)
        print(f"wrote {args.plot_out}")
        return runs
    if not (args.proxy_url and args.prefill_url and args.decode_url):
        parser.error("--proxy-url, --prefill-url and --decode-url are needed to probe")
    with httpx.Client(timeout=120) as client:
        result = probe(
            client,
            args.proxy_url,
            args.prefill_url,
            args.decode_url,
            args.model,
            args.requests,
            args.input_len,
            vocab_size=args.vocab_size,
            other_proxy_url=args.other_proxy_url,
        )
    for row in result["rows"]:
        print("  ".join(f"{k} {v:8.1f}" for k, v in row.items()), file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
