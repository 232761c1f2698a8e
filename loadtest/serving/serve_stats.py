"""Client-side serving statistics: per-request timings in, phase summary out.

Definitions follow vLLM's own serving benchmark, so figures compare with it:
- TTFT: request sent to the first streamed chunk that carries a choice;
- ITL: the gaps between consecutive chunks of one request (a chunk may carry several
  tokens when speculative decoding accepts drafts, so ITL is per chunk, not per token);
- TPOT: (end-to-end latency - TTFT) / (output tokens - 1), per request;
- E2E: request sent to the stream's end;
- goodput: requests per second that met every SLO given (ttft, tpot, e2e, in ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""
    # The proxy's Server-Timing phases in ms and the workers that served it, when it sends
    # them (pdspec's proxy.observability.served_by_headers); empty otherwise.
    phases_ms: dict[str, float] = field(default_factory=dict)
    served_by: dict[str, str] = field(default_factory=dict)

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def distribution_ms(values_s: list[float]) -> dict[str, float | None]:
    """mean, median, p90 and p99 in milliseconds (None when there is nothing to summarise):
    vllm bench serve's figures, and the p90 that SLOs and the planner are stated in."""
    if not values_s:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    ms = np.asarray(values_s, dtype=float) * 1000.0
    return {
        "mean": float(ms.mean()),
        "median": float(np.median(ms)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
    }


def parse_slos(items: list[str]) -> dict[str, float]:
    """`ttft:500 tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        slos[name] = float(value)
        if slos[name] <= 0:
            raise ValueError(f"SLO {item!r}: the limit must be positive")
    return slos


def meets_slos(result: RequestResult, slos: dict[str, float]) -> bool:
    if not result.ok:
        return False
    measured = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2e": result.e2e_s}
    for name, limit_ms in slos.items():
        value = measured[name]
        # A one-token reply has no TPOT: nothing there to miss.
        if value is not None and value * 1000.0 > limit_ms:
            return False
    return True


def summarize(results: list[RequestResult], duration_s: float, slos: dict[str, float] | None = None) -> dict:
    """One phase's client-side figures (the JSON's phase object, less worker metrics)."""
    done = [r for r in results if r.ok]
    itl = [gap for r in done for gap in r.itl_s]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    output_tokens = sum(r.output_tokens for r in done)
    summary = {
        "requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration_s,
        "prompt_tokens": sum(r.prompt_tokens for r in done),
        "output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s if duration_s > 0 else 0.0,
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else 0.0,
        "ttft_ms": distribution_ms([r.ttft_s for r in done]),
        "itl_ms": distribution_ms(itl),
        "tpot_ms": distribution_ms(tpot),
        "e2e_ms": distribution_ms([r.e2e_s for r in done]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    if slos:
        good = sum(meets_slos(r, slos) for r in results)
        summary["slos_ms"] = dict(slos)
        summary["good_requests"] = good
        summary["goodput"] = good / duration_s if duration_s > 0 else 0.0
    return summary
