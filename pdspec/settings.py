"""All of pdspec's configuration, in one typed place.

Every field has the same name on the command line, in the environment and in a TOML
file: `--prefill.port 8100`, `PDSPEC_PREFILL__PORT=8100`, `[prefill] port = 8100`.
Nested groups use a dot on the CLI and a double underscore in the environment, at any
depth: `--proxy.routing.prefill_policy kv_aware`, `PDSPEC_PROXY__ROUTING__PREFILL_POLICY`,
`[proxy.routing] prefill_policy = "kv_aware"`.

A setting exists only where it applies, and is refused elsewhere (`extra="forbid"`): the
proxy's settings are in one group per concern, each proxy component built from its own
(`RoutingSettings` for the routing, `HealthSettings` for the health and pairing checks,
...); a prefill worker's own fields are on `PrefillWorkerSettings` only, a decode worker's
on `DecodeWorkerSettings`; what the pair must agree on (the model, the KV transfer mode)
is `ModelSettings`, set once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from decode_worker import role as decode_role
from pdspec.contract import DecodeRoutingPolicy, Disaggregation, DraftsPolicy, RoutingPolicy
from prefill_worker import role as prefill_role

ENV_PREFIX = "PDSPEC_"
CONFIG_ENV = "PDSPEC_CONFIG"


# What a prefill and a decode worker must agree on for the decode worker to read the
# prefill worker's KV (labels of pdspec_worker_info; see proxy/fleet/pairing.py).
PairingField = Literal["model", "drafter", "method", "block_size", "kv_connector"]


def default_home() -> Path:
    return Path(os.environ.get("PDSPEC_HOME", Path.home() / ".cache" / "pdspec"))


def port_range(spec: str) -> tuple[int, int]:
    """'5600' or '5600-5663' as (low, high), both inclusive."""
    low, _, high = spec.partition("-")
    if not low.isdigit() or (high and not high.isdigit()):
        raise ValueError(f"a port range is 'N' or 'N-M', got {spec!r}")
    first, last = int(low), int(high or low)
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"a port range must lie in 1-65535 with its low end first, got {spec!r}")
    return first, last


def _checked_port_range(spec: str) -> str:
    port_range(spec)
    return spec


PortRange = Annotated[str, AfterValidator(_checked_port_range)]


class ModelSettings(BaseModel):
    """The model pair both workers serve, and how its KV moves between them. Prefill and
    decode must agree on all of it (NIXL's handshake hashes the drafter settings; the KV
    connector is a pairing field), so it is set once."""

    target: str | None = Field(
        None, description="Target model path; unset: the local small model (built on first use)."
    )
    drafter: str | None = Field(
        None, description="Drafter path; unset: the local EAGLE3 drafter (when method is eagle3)."
    )
    method: Literal["eagle3", "eagle", "dflash", "mtp", "draft_model", "none"] = "eagle3"
    num_speculative_tokens: int = Field(3, ge=1, le=64, description="K on the decode worker.")
    speculative_extra: dict[str, Any] = Field(
        default_factory=dict, description="Extra keys merged into vLLM's speculative config."
    )
    served_model_name: str | None = Field(
        None, description="Name clients use; unset: 'pdspec-tiny' for the local model, else the path."
    )
    max_model_len: int = 2048
    dtype: str | None = Field(
        None,
        description="vLLM --dtype; unset: float32 for the local model (its greedy choices are "
        "rounding-sensitive; bf16 compute lowers its acceptance), vLLM's auto otherwise.",
    )
    models_dir: Path = Field(
        default_factory=lambda: default_home() / "models",
        description="Where `pdspec models` installs the local model pair.",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's --tool-call-parser on both workers (e.g. hermes for Qwen3): tool calls in "
        "replies, and tool_choice='auto'. The prefill worker needs it too, or it refuses such requests. Unset: "
        "hermes for the local model (its chat template renders tools and tool calls in hermes' format).",
    )
    enable_auto_tool_choice: bool = Field(
        True,
        description="vLLM's --enable-auto-tool-choice on both workers whenever a tool call parser is in use "
        "(tool_choice='auto' parses tool calls out of the reply); false: named and required tool choice only.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's --reasoning-parser on both workers (e.g. qwen3): thinking in the reply's "
        "`reasoning` field. Unset: none, also for the local model (it does not think; see the README on text "
        "parsers such as granite and structured outputs).",
    )
    compact_json: bool | None = Field(
        None,
        description="Grammar-constrained JSON (response_format, structured_outputs, named and required tool "
        "calls) without free whitespace: vLLM's structured_outputs_config disable_any_whitespace, backend xgrammar "
        "(the option needs a named backend). Unset: on for the local model (greedy, it fills a JSON object with "
        "newlines until max_tokens), vLLM's default otherwise.",
    )
    tool_call_grammar: Literal["envelope", "arguments"] | None = Field(
        None,
        description="How vLLM constrains a named or required tool call: envelope (vLLM's default: the tool "
        "parser's whole call, e.g. <tool_call>{...}</tool_call>, with free whitespace inside it) or arguments (the "
        "arguments' JSON schema alone, which compact_json keeps compact); vLLM's VLLM_ENFORCE_STRICT_TOOL_CALLING. "
        "Unset: arguments for the local model (inside the envelope it writes newlines until max_tokens), vLLM's "
        "default otherwise.",
    )
    kv_transfer: Literal["pull", "push"] = Field(
        "pull",
        description="How the prompt's KV moves over NIXL: pull (vLLM's NixlConnector: the decode worker "
        "READs it from the prefill worker) or push (NixlPushConnector: the prefill worker WRITEs it into the "
        "blocks the decode worker registers). Set once for the pair: `pdspec up` gives it to both workers; "
        "`pdspec prefill` and `pdspec decode` each take it, and the proxy's pairing check refuses a pair that "
        "does not agree. Take push where the workers' GPUs share no NVLink or RDMA, one GPU included: UCX serves "
        "a READ there over TCP, measured 0.44 GB/s on one H200 (1.3 s for a 4,096-token prompt of Qwen3-8B), "
        "and a WRITE over cuda_ipc. A push prefill worker finds the request by its id: one X-Request-Id on "
        "both legs (the proxy sends one).",
    )


class WorkerSettings(BaseModel):
    """One vLLM worker: what every role has (a prefill or decode worker adds its own fields:
    PrefillWorkerSettings, DecodeWorkerSettings). A field of another role is refused."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8100
    side_channel_host: str = Field("127.0.0.1", description="NIXL side channel address peers reach.")
    side_channel_port: int = 5600
    kv_buffer_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where NIXL registers KV: auto = cpu on a CPU build, cuda on a GPU."
    )
    nixl_progress_delay_us: int = Field(
        1000,
        ge=0,
        description="Sleep of NIXL's progress thread between polls; 0 busy-spins a core.",
    )
    spin_window_ms: float = Field(
        5.0,
        ge=0,
        description="CPU builds: how long vLLM's engine core and worker processes spin (sched_yield) "
        "for the next message on their shared-memory queue before they sleep until notified; vLLM spins 1 s, "
        "which takes a core from the engines beside them (the short_spin engine feature). Only engines with a worker "
        "process have such a queue: of several ranks, or with in_core_worker off. 0: vLLM's own.",
    )
    in_core_worker: bool = Field(
        True,
        description="CPU builds: an engine of one process runs its model in vLLM's engine-core process, as on a "
        "GPU, instead of a worker process of its own (the in_core_worker engine feature): one interpreter less "
        "to start and no shared-memory queue between the two; its OpenMP threads are bound as vLLM binds a "
        "worker's. False: vLLM's worker process. Tensor, pipeline or data parallel engines keep it either way.",
    )
    kv_lease_s: int = Field(
        120,
        ge=1,
        description="How long a prefill worker keeps a prompt's KV for its decode worker before freeing "
        "it (the KV connector's kv_lease_duration; vLLM's default is 30), renewed by the decode worker's "
        "heartbeats. Set alike on both roles. Longer than a decode engine's stall (about 50 s seen when a prefill "
        "worker it read from died); a decode worker prefills itself a request that reached its scheduler more "
        "than half of it after arriving (its KV may be gone).",
    )
    kv_events: bool = Field(
        True,
        description="Publish vLLM's KV-cache events (ZMQ, with a replay endpoint) for the proxy's "
        "cache-aware routing; the ports are in pdspec_worker_info, so the proxy needs no setting of its own.",
    )
    kv_events_port: int = Field(
        5650,
        description="Port of the KV-event publisher; its replay endpoint is kv_events_port + "
        "kv_events_replay_offset. With data parallelism vLLM adds the rank to both.",
    )
    kv_events_replay_offset: int = Field(
        1,
        ge=1,
        description="Replay port minus publisher port; at least the data-parallel size, or the ranks' ports collide.",
    )
    scale_out_api: bool = Field(
        True,
        description="vLLM's --enable-scale-out (prefill and decode workers; not a colocated server, which "
        "clients reach): its render endpoints give the proxy's cache-aware routing the token ids of Responses and "
        "Messages requests (/v1/responses/render, /v1/messages/render). It also serves /inference/v1/generate; "
        "the proxy forwards no client request to any of them. Off: those requests are routed without cache "
        "knowledge.",
    )
    drafts: DraftsPolicy = Field("auto", description="auto: propose with K=0 when no request can use drafts.")
    engine_plugin: bool = Field(
        True, description="Load pdspec's scheduler into vLLM: K=0 proposals and counters, pdspec_worker_info."
    )
    enforce_eager: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    cuda_visible_devices: str | None = Field(None, description="GPUs of this worker (e.g. '0'); unset: inherit.")
    cpu_kvcache_space_gib: int = Field(1, description="VLLM_CPU_KVCACHE_SPACE on CPU builds.")
    cpu_omp_threads_bind: str | None = Field(
        None, description="VLLM_CPU_OMP_THREADS_BIND on CPU builds (e.g. '0' or '0-3')."
    )
    extra_vllm_args: list[str] = Field(default_factory=list, description="Passed to vLLM as is.")
    engine_cache_dir: Path | None = Field(
        None,
        description="Where vLLM and torch inductor keep their caches (VLLM_CACHE_ROOT: the model classes' "
        "inspection, compiled graphs; TORCHINDUCTOR_CACHE_DIR), which a later start reuses: on two CPU cores a "
        "worker that finds the model inspection cached starts about 15 s sooner. Eager workers (enforce_eager) may "
        "share one folder across workers and runs (vLLM writes the model-inspection entries atomically); compiling "
        "workers should not start together on one folder (vLLM writes its compile cache's files in place). "
        "Unset: <run_dir>/<role>/.",
    )
    replicas: int = Field(
        1,
        ge=1,
        le=16,
        description="`pdspec up`: workers of this role (xPyD). Replica i listens on port + i, "
        "side_channel_port + 4i and kv_events_port + 2i; cpu_omp_threads_bind and cuda_visible_devices are split "
        "among the replicas when they list enough cores or GPUs.",
    )
    test_hooks: bool = Field(
        False,
        description="Tests only: a prefill worker skips writing drafter KV while "
        "<run_dir>/prefill/test-skip-drafter-prefill exists (negative control); a decode worker saves the "
        "drafter KV it received over NIXL into <run_dir>/decode/test-drafter-kv-dump while that folder exists.",
    )


class RoutingSettings(BaseModel):
    """How the proxy picks the workers of a request, and whether it disaggregates it at all
    (proxy/routing/: the policies, the KV index, the P/D decision)."""

    model_config = ConfigDict(extra="forbid")

    prefill_policy: RoutingPolicy = Field(
        "prefix_affinity",
        description="How a prefill worker is picked (proxy/routing/policies/); prefix_affinity: a "
        "rendezvous hash of the prompt's start, so repeated prefixes hit one worker's prefix cache.",
    )
    decode_policy: DecodeRoutingPolicy = Field(
        "least_outstanding",
        description="How a decode worker is picked (proxy/routing/policies/); kv_aware: the one "
        "holding most of the prompt (a conversation's earlier turns) against its load.",
    )
    disaggregation: Disaggregation = Field(
        "always",
        description="conditional: when the decode worker picked holds all but fewer than "
        "local_prefill_max_tokens of the prompt, it prefills the rest itself (no prefill leg, no KV transfer); "
        "with local_prefill_on_queue, also when the prefill pool's queue is the longer one; with "
        "decode_on_prefill_when_full, a prefill worker serves a request whole when no decode worker has KV room "
        "for it.",
    )
    local_prefill_max_tokens: int = Field(
        512,
        ge=0,
        description="conditional disaggregation: a decode worker prefills a prompt itself, whatever the queues, "
        "when it lacks fewer than this many of its tokens; with local_prefill_on_queue, also the margin by which the prefill pool's work ahead "
        "must exceed the decode worker's before it prefills a longer prompt. 0: never prefill on a decode worker.",
    )
    local_prefill_on_queue: bool = Field(
        True,
        description="conditional disaggregation with a kv_aware prefill pool (the only policy whose legs lease "
        "their uncached tokens): the decode worker also prefills a prompt itself when every prefill worker has a "
        "leg in flight and the prefill pool's work ahead of it (the least over its workers of the prompt's uncached part, the legs' uncached tokens in "
        "flight and kv_aware_load_tokens per leg, plus one kv_aware_load_tokens for the hand-off) exceeds the "
        "decode worker's (the part it lacks plus its own local prefills in flight) by more than "
        "local_prefill_max_tokens; counted as reason prefill_queue. Both pools run the same engine, so the "
        "tokens compare directly. Why: with prompts longer than local_prefill_max_tokens that no decode worker "
        "holds, conditional was always-disaggregated and queued on a saturated prefill pool while decode "
        "workers could have prefilled (loadtest/results/fleet/h200-qwen3-8b/, point 4). Off: the "
        "local_prefill_max_tokens rule alone.",
    )
    decode_on_prefill_when_full: bool = Field(
        True,
        description="conditional disaggregation: when no healthy decode worker has KV room for a prompt that "
        "would be disaggregated (the prompt tokens its legs in flight hold, by the proxy's own count, plus this "
        "prompt exceed its KV size, num_gpu_blocks x block_size of its vllm:cache_config_info) and a prefill "
        "worker has room by the same count (its decode legs, its prefill legs in flight and the prompt), that "
        "prefill worker serves the request whole, prefill and decode, with no KV transfer (the one with the most "
        "room); counted as local prefill reason decode_full. If that leg fails before its reply begins, the "
        "request goes to the decode pool as a decode-only one. Why: a request that would wait for decode KV is "
        "decoded where there is KV; with the decode pool's KV full, conditional disaggregation lost to a "
        "colocated fleet of the same engines, which decoded in all of them "
        "(loadtest/results/fleet/h200-qwen3-8b/round2/conditional-analysis.md). Its cost: that prefill "
        "worker's steps mix decodes with prefills, slowing both. A worker whose KV size cannot be read is never "
        "judged full and never serves a request whole. Off: such requests wait for decode KV room.",
    )
    decode_full_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="decode_on_prefill_when_full: the share of a decode worker's KV size that the proxy's count "
        "of its legs' prompt tokens may fill before the worker is judged full (prefill workers' room: "
        "decode_full_prefill_share). Below 1 it spills to the prefill workers earlier, leaving room for what the count "
        "leaves out: generated tokens, blocks part-filled, a prompt's KV arriving before its leg is counted.",
    )
    decode_full_prefill_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="decode_on_prefill_when_full: the share of a prefill worker's KV size that its count (the prompt "
        "tokens of its prefill legs in flight and of the requests it serves whole) may fill with a request served "
        "whole. Below 1 it keeps room for the prefill legs the worker is there for: at 1, the H200 fleet's prefill "
        "workers took seven 4.4k-token requests whole each (30.5k of 32.8k tokens) at 11 QPS, and the prefill legs "
        "sent to them next took 1.6-3.6 s, with 2.3k tokens of room by that count (loadtest/results/fleet/h200-qwen3-8b/round5/). Its cost: "
        "fewer requests served whole, more waiting for decode KV. 1 by default until measured (fleet_bench's "
        "kv_aware_conditional_pending_p75).",
    )
    decode_full_counts_pending: bool = Field(
        True,
        description="decode_on_prefill_when_full: the decode pool is also judged full when its room (over its "
        "healthy workers, decode_full_share of each one's KV size less the prompt tokens its legs hold) less the "
        "prompt tokens of the requests planned disaggregated whose decode leg has not started yet (their prefill "
        "legs run or wait for room; pdspec_proxy_decode_pending_tokens) is short of the prompt. Why: a decode worker counts a "
        "disaggregated request only once its decode leg starts, about a prefill leg after it was planned, so a "
        "burst was planned disaggregated on the room of before it and waited at the hand-off for decode KV (H200 "
        "fleet, 11 QPS: TTFT p50 3.4-4.0 s behind a ~1 s prefill leg, against 1.1-1.8 s for the requests "
        "prefilled where they decoded). Its cost: more requests served whole on prefill workers, whose steps then "
        "mix decodes with prefills; the pool's room is summed, so fragments too small for any prompt count as "
        "room. On by default since the H100 fleet runs (2P2D, Qwen3-8B shape, sc3x; "
        "loadtest/results/fleet/h100-qwen3-8b/): at 8 QPS it met the relaxed SLO for 7.17 req/s [7.00-7.25] "
        "over 3 runs against 6.44 [6.25-7.00] over 4 without it, TTFT p90 1.22-1.26 s against 1.31-2.48 s, "
        "and the same within the noise at 4, 6 and 11 QPS; the 11-QPS gap to colocated stays (the runs that found it: "
        "loadtest/results/fleet/h200-qwen3-8b/round5/). False: a planned request counts from its decode leg.",
    )
    kv_aware_load_tokens: int = Field(
        256,
        ge=0,
        description="kv_aware routing: the fixed cost of one leg in flight on a worker, in prompt tokens "
        "to prefill. A prefill worker's load also counts the uncached prompt tokens of the legs it runs; a decode "
        "worker's the prompt tokens its decode legs hold in its KV cache (1024 sent a shared prefix away from its "
        "holder whenever one leg ran there: loadtest/results/routing/).",
    )
    kv_aware_churn_weight: float = Field(
        0.5,
        ge=0,
        description="kv_aware routing on the prefill pool: what each uncached prompt token a worker "
        "would compute and store costs, in prompt tokens, at an even share of the pool's recent cache churn "
        "(scaled by the worker's share times the pool's size). Storing evicts the least recently used blocks, "
        "younger on a worker that stored more lately, so misses spread over the pool instead of following a short "
        "prefix one worker holds (a system prompt); 0: off. At an even share it makes cached tokens weigh "
        "1 + this against load (proxy/routing/policies/kv_aware.py).",
    )
    kv_index_max_blocks: int = Field(
        200_000,
        ge=1,
        description="Most KV blocks the proxy's cache index keeps per worker (about 230 bytes "
        "each); the oldest go first.",
    )
    kv_routed_ttl_s: float = Field(
        2.0,
        ge=0,
        description="How long a routing decision counts as the worker holding the prompt's blocks, "
        "before its KV events say so (a burst sharing a prefix then lands on one worker).",
    )
    tokenize_timeout_s: float = Field(
        0.5,
        gt=0,
        description="kv_aware routing: the longest wait for a decode worker's /tokenize (a text "
        "prompt or a chat) or render endpoint (Responses, Messages); then the request is routed without cache "
        "knowledge.",
    )
    tokenizer: Path | None = Field(
        None,
        description="Cache-aware routing: the served model's tokenizer, a model folder (its tokenizer.json; "
        "chat_template.jinja or tokenizer_config.json for chats) or a tokenizer.json file. The proxy then "
        "tokenizes text prompts and plain chats itself (proxy/routing/local_tokenizer.py: no /tokenize round "
        "trip), once a decode worker's /tokenize has given the same ids for its probes (else, and for what it "
        "cannot render exactly, the round trip as when unset). Loaded at start-up when cache-aware routing is "
        "on: a file that is missing or unreadable stops the proxy. `pdspec up` sets it to the target model's "
        "folder when that is local. Unset: every text prompt and chat goes to a decode worker's /tokenize.",
    )
    structured_outputs: Literal["disaggregated", "decode_only"] = Field(
        "disaggregated",
        description="Grammar-constrained requests (response_format, structured_outputs, a named "
        "or required tool_choice): through P/D as any other (their KV pulled over NIXL), or prefilled by their "
        "decode worker (decode_only, counted in pdspec_proxy_decode_only_total). decode_only is the way out should "
        "a vLLM build sample outside the grammar after a KV pull, as vllm-cpu 0.32 once did here (see the README).",
    )


class RetrySettings(BaseModel):
    """What the proxy does when a worker leg fails (proxy/flow/disagg.py)."""

    model_config = ConfigDict(extra="forbid")

    prefill_failure_policy: Literal["error", "retry", "fallback"] = Field(
        "retry",
        description="error: return it; retry: another prefill worker (bounded, backoff); "
        "fallback: decode-only, the decode worker prefills itself.",
    )
    prefill_retries: int = Field(2, ge=0, le=10, description="Other prefill workers tried under the retry policy.")
    decode_retries: int = Field(1, ge=0, le=10, description="Only before the first byte reached the client.")
    backoff_s: float = Field(0.05, description="First pause before a retry; doubles each attempt.")


class WorkerClientSettings(BaseModel):
    """How the proxy talks to the workers: connections, reply limits, leg deadlines and the key it
    sends (proxy/upstream/client.py, proxy/flow/disagg.py)."""

    model_config = ConfigDict(extra="forbid")

    prefill_timeout_s: float = Field(
        20.0, description="Kept below the workers' KV lease so no blocks outlive a request."
    )
    decode_timeout_s: float | None = Field(
        None,
        description="Optional cap on a whole decode leg, first byte to last; unset: none, a stream runs as "
        "long as its worker keeps sending (see idle_timeout_s).",
    )
    idle_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="Longest silence from a worker while its reply is due, before the first byte and "
        "between any two; a non-streamed reply sends nothing until it is done, so this bounds it whole.",
    )
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="Largest head of a worker's reply.")
    max_body_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="Largest worker reply read whole (streams are relayed as they come)."
    )
    connect_timeout_s: float = Field(5.0, description="Longest wait for a worker connection.")
    api_key: str | None = Field(None, description="Sent to workers; never a client's key.")


class HealthSettings(BaseModel):
    """Health and pairing checks of the workers (proxy/fleet/health.py, proxy/fleet/pairing.py):
    which workers the pools route to."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(2.0, description="Health-check every worker this often.")
    timeout_s: float = Field(
        2.0, description="A health check that takes longer fails (unless the proxy's own loop was blocked)."
    )
    eject_after_failures: int = Field(2, description="Consecutive failed checks that eject a worker.")
    readmit_after_successes: int = Field(2, description="Consecutive good checks that re-admit an ejected worker.")
    expected_worker_config: dict[PairingField, str | int] = Field(
        default_factory=dict,
        description='What every worker must report, e.g. {"block_size": 128}; fields left out (or all, '
        "when empty) must equal the first admitted worker's.",
    )
    unverified_workers: Literal["admit", "refuse"] = Field(
        "admit",
        description="A worker whose /metrics has no pdspec_worker_info (plain vLLM): admit it with a "
        "warning, or refuse it.",
    )
    worker_info_interval_s: float = Field(
        30.0,
        gt=0,
        description="Re-read each worker's pdspec_worker_info this often; also at once when a "
        "worker joins or answers again after a failed health check.",
    )


class AdmissionSettings(BaseModel):
    """Admission of client requests (proxy/admission/): the in-flight limit and its queue, and
    optionally KV room on the prefill workers (`prefill_kv`, proxy/admission/kv_room.py)."""

    model_config = ConfigDict(extra="forbid")

    max_inflight: int = Field(256, ge=1, description="Client requests served at once; more wait in the queue.")
    max_queue: int = Field(1024, ge=0, description="Requests waiting for a slot; beyond it, 429 with Retry-After.")
    queue_timeout_s: float = Field(10.0, description="Longest wait in the queue; then 503.")
    retry_after_s: int = Field(1, description="Retry-After of a 429 or 503.")
    prefill_kv: bool = Field(
        False,
        description="Send a prefill leg only to a prefill worker whose KV (read from its /metrics) has "
        "room for the prompt; otherwise wait, up to queue_timeout_s, then 503 with Retry-After. A KV bottleneck "
        "(decode workers taking KV more slowly than prefill workers make it) then queues in the proxy instead of "
        "timing out prefill legs.",
    )
    prefill_kv_headroom: float = Field(
        0.9,
        gt=0,
        le=1,
        description="prefill_kv: the share of a prefill worker's KV the proxy fills.",
    )
    prefill_queue_budget_s: float | None = Field(
        None,
        ge=0,
        description="prefill_kv: the most prefill time the proxy queues on one prefill worker "
        "(the prompts in flight there and the next one, at the worker's rate as measured from its replies); unset: "
        "half of worker_client.prefill_timeout_s, so an admitted leg ends well inside its timeout; 0: no time check, KV room only.",
    )
    prefill_kv_read_interval_s: float = Field(
        0.5,
        gt=0,
        description="prefill_kv: how often each prefill worker's KV size and use are read.",
    )
    prompt_chars_per_token: float = Field(
        2.0,
        gt=0,
        description="prefill_kv: a text prompt's size in tokens, when its token ids are not "
        "known (cache-aware routing reads them), is its characters over a ratio that starts here and follows the "
        "prefill replies' own counts. Low on purpose: a prompt taken as larger than it is waits a little; one "
        "taken as smaller can overfill a prefill worker before the ratio has learned.",
    )


class ClientSettings(BaseModel):
    """Limits on client connections and requests, refused before they hold the event loop or
    memory (proxy/edge/connections.py, proxy/edge/endpoint.py), and the client keys."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(4 * 1024 * 1024, description="Largest request body; beyond it, 413.")
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest request head (request line and headers); beyond it, 431."
    )
    head_timeout_s: float = Field(10.0, gt=0, description="From a request's first byte to its last header; then 408.")
    body_timeout_s: float = Field(
        60.0, gt=0, description="From a request's last header to its last body byte; then 408."
    )
    idle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A client connection with no request under way (new, or kept alive) is closed after this.",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Open client connections; one more is answered 503 and closed. Keep it above "
        "admission.max_inflight + admission.max_queue (each waiting or streaming request holds one).",
    )
    max_choices: int = Field(
        64,
        ge=1,
        description="Most choices in one request (`n`, times the prompts of a completions prompt list): "
        "each choice is its own prefill and decode.",
    )
    api_keys: list[str] = Field(default_factory=list, description="Client keys (Bearer); empty: no auth.")


class ObservabilitySettings(BaseModel):
    """The proxy's logs, traces and served-by headers."""

    model_config = ConfigDict(extra="forbid")

    served_by_headers: bool = Field(
        False,
        description="Replies carry X-Pdspec-Prefill-Worker and X-Pdspec-Decode-Worker (`local`: the "
        "decode worker prefilled) and a Server-Timing header of the request's phases (route, prefill, decode: "
        "proxy/flow/disagg.py, server_timing). Off by default: worker addresses and timings are internal.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="The proxy's log level.")
    access_log: bool = Field(
        False,
        description="A log line for every request, not only failed ones (costs about a third of the "
        "proxy's peak rate: loadtest/micro/proxy_bench.py --access-log).",
    )
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object per line.")
    otlp_traces_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector (http://host:4318): spans for prefill, handoff and decode."
    )
    plan_replicas: dict[Literal["prefill", "decode"], Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="The fleet planner's replicas per role (`pdspec plan --emit` writes them), exported as "
        "pdspec_plan_replicas{role} for autoscalers: the scaling components of deploy/k8s keep the decode workers "
        "at least at the plan's ratio of the prefill workers. Unset: not exported.",
    )


class KvTransferSettings(BaseModel):
    """The proxy's side of the KV hand-off (proxy/flow/disagg.py): which NIXL side channels a
    prefill reply may name, and early decode. The transfer mode itself is the workers' pair
    setting (`model.kv_transfer`)."""

    model_config = ConfigDict(extra="forbid")

    early_decode: bool = Field(
        False,
        description="Where the KV is pushed (the workers' model.kv_transfer = push): send the decode leg together with the "
        "prefill leg, so the decode worker's blocks are registered with the prefill worker before its prefill "
        "ends and the WRITE starts at once (proxy/flow/early_decode.py). The decode worker holds the prompt's blocks "
        "while the prefill runs, and a prefill worker that dies mid-prefill leaves them held until the decode "
        "worker restarts (vLLM's push connector has no receive deadline): opt-in.",
    )
    source_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts besides the answering prefill worker's own that may appear as remote_host in its "
        "kv_transfer_params (a NIXL side channel on another address than the HTTP one).",
    )
    source_ports: list[PortRange] = Field(
        default_factory=lambda: ["5600-5663"],
        description="Ports ('N' or 'N-M') that may appear as remote_port in a prefill worker's "
        "kv_transfer_params: its NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT, 5600 by default, plus the "
        "data-parallel rank). `pdspec up` adds its prefill worker's port.",
    )


class ProxySettings(BaseModel):
    """`pdspec proxy`: where it listens, the workers it serves, and one group per concern;
    each proxy component is built from its own group (proxy/app.py)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Address the proxy listens on (0.0.0.0 in containers).")
    port: int = Field(8000, description="Port the proxy listens on.")
    workers: int = Field(
        1,
        ge=1,
        description="Proxy processes on its port, so it uses that many cores (SO_REUSEPORT: the kernel spreads "
        "connections over them). 1: one process, no parent. More: a parent starts them and restarts one that exits "
        "(proxy/processes.py); each health-checks the workers, reads their KV events and routes on its own; they "
        "divide admission.max_inflight, admission.max_queue and clients.max_connections, so these hold for the "
        "proxy as a whole; any of them answers /ready and /metrics for all (docs/proxy.md, the proxy across cores).",
    )
    # Membership: a static list of URLs, or DNS names re-resolved periodically (a headless
    # Kubernetes service): "dns://prefill.pdspec.svc:8100" yields one worker per address.
    prefill_urls: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8100"],
        description="Prefill workers: URLs, or dns://name:port for one worker per address the name resolves to.",
    )
    decode_urls: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8200"],
        description="Decode workers, as prefill_urls.",
    )
    dns_refresh_s: float = Field(10.0, description="Re-resolve dns:// worker names this often.")
    gc_interval_s: float = Field(
        10.0,
        ge=0,
        description="Collect reference cycles every this many seconds instead of Python's automatic "
        "collector (0: keep the automatic one).",
    )
    routing: RoutingSettings = Field(
        default_factory=RoutingSettings, description="Worker choice and the P/D decision (KvRouter, the policies)."
    )
    retries: RetrySettings = Field(default_factory=RetrySettings, description="Failed legs (the Disaggregator).")
    worker_client: WorkerClientSettings = Field(
        default_factory=WorkerClientSettings, description="Talking to the workers (UpstreamClient, leg deadlines)."
    )
    health: HealthSettings = Field(
        default_factory=HealthSettings, description="Health and pairing checks (HealthChecker, Pairing)."
    )
    admission: AdmissionSettings = Field(
        default_factory=AdmissionSettings, description="The request queue and KV room (Admission, KvRoom)."
    )
    clients: ClientSettings = Field(
        default_factory=ClientSettings, description="Client connection and request limits, client keys (the edge)."
    )
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings, description="Logs, traces, served-by headers."
    )
    kv_transfer: KvTransferSettings = Field(
        default_factory=KvTransferSettings, description="The KV hand-off: allowed NIXL sources, early decode."
    )

    @model_validator(mode="after")
    def _limits_cover_every_process(self) -> ProxySettings:
        """Each of `workers` processes enforces its share of the proxy's limits, and a share
        of no request or no connection would be a process that refuses everything; the
        processes share a port the kernel assigns, so an ephemeral one (0) cannot be shared."""
        if self.workers > 1:
            for name, limit in (
                ("admission.max_inflight", self.admission.max_inflight),
                ("clients.max_connections", self.clients.max_connections),
            ):
                if limit < self.workers:
                    raise ValueError(f"{name} ({limit}) is divided among the {self.workers} workers: at least one each")
            if self.port == 0:
                raise ValueError("workers > 1 share one port: port 0 would give each process its own")
        return self

    def queue_budget(self) -> float | None:
        """admission.prefill_queue_budget_s in force (None: admission checks KV room only);
        unset, half of worker_client.prefill_timeout_s."""
        budget = self.admission.prefill_queue_budget_s
        if budget is None:
            budget = self.worker_client.prefill_timeout_s / 2
        return budget or None


class _Base(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        cli_kebab_case=False,
        cli_implicit_flags=True,
        nested_model_default_partial_update=True,
        extra="ignore",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence: CLI (init) > environment > TOML file named by PDSPEC_CONFIG.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_ENV)
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)


class ProxyCommand(_Base):
    """`pdspec proxy`: the OpenAI-compatible front end."""

    proxy: ProxySettings = Field(default_factory=ProxySettings)


class WorkerCommand(_Base):
    """`pdspec prefill` / `pdspec decode`: one vLLM worker."""

    model: ModelSettings = Field(default_factory=ModelSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    run_dir: Path = Field(
        default_factory=lambda: default_home() / "run",
        description="Caches, logs and Prometheus multiprocess files of started processes.",
    )


class ModelsCommand(_Base):
    """`pdspec models`: install the local small model pair (shipped, trained)."""

    model: ModelSettings = Field(default_factory=ModelSettings)
    force: bool = False


class PrefillWorkerSettings(WorkerSettings):
    """A prefill worker: the fields only it has, and its defaults in `pdspec up` and
    `pdspec prefill` (prefill_worker/role.py): its own ports and the first core."""

    port: int = prefill_role.PORT
    side_channel_port: int = prefill_role.SIDE_CHANNEL_PORT
    kv_events_port: int = prefill_role.KV_EVENTS_PORT
    cpu_omp_threads_bind: str | None = prefill_role.CPU_CORE

    kv_hold_poll_s: float = Field(
        0.2,
        ge=0,
        le=5,
        description="Prefill worker: while its only requests are finished ones whose KV awaits a read, "
        "its engine waits for new work up to this long between steps instead of vLLM's 1 ms (the kv_hold_wait "
        "engine feature; held blocks are freed up to this much later, while nothing waits for them, so the proxy's "
        "admission.prefill_kv sees freed room up to this much later too). 0: vLLM's own loop.",
    )
    kv_only_drafter: bool = Field(
        True,
        description="Prefill worker, K=0 steps: run only what the drafter's KV needs (fc, embedding, norms, "
        "K/V projections, rotary, cache write), not its attention, MLP or head. EAGLE3 Llama drafters.",
    )
    dp_idle_rank_vote: bool = Field(
        True,
        description="Prefill worker with data parallelism on an MoE model (vLLM 0.33, V2 runner; a dense model's "
        "ranks run independently and never vote): an idle rank votes 'skip drafts', so it does not make the busy "
        "ranks draft; false keeps vLLM's own vote (A/B runs).",
    )


class DecodeWorkerSettings(WorkerSettings):
    """A decode worker: the fields only it has, and its defaults in `pdspec up` and
    `pdspec decode` (decode_worker/role.py): its own ports and the second core. A prefill
    worker's field (kv_only_drafter, kv_hold_poll_s, dp_idle_rank_vote) is refused."""

    port: int = decode_role.PORT
    side_channel_port: int = decode_role.SIDE_CHANNEL_PORT
    kv_events_port: int = decode_role.KV_EVENTS_PORT
    cpu_omp_threads_bind: str | None = decode_role.CPU_CORE

    kv_load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description="Decode worker: a KV pull that fails (its prefill worker died or restarted) is "
        "recomputed here (recompute), or ends the request with an error (fail, vLLM's default).",
    )


class PrefillCommand(WorkerCommand):
    """`pdspec prefill`: one prefill worker, on the prefill role's default ports."""

    worker: PrefillWorkerSettings = Field(default_factory=PrefillWorkerSettings)


class DecodeCommand(WorkerCommand):
    """`pdspec decode`: one decode worker, on the decode role's default ports."""

    worker: DecodeWorkerSettings = Field(default_factory=DecodeWorkerSettings)


class ColocatedWorkerSettings(WorkerSettings):
    """The one server of `pdspec up --layout colocated`: prefill and decode in one vLLM, no
    proxy, on the port clients use in 1P1D (the proxy's), so the two compare as is."""

    port: int = 8000


class UpCommand(_Base):
    """`pdspec up`: the prefill and decode workers (one each, or `replicas`) and the proxy, supervised."""

    layout: Literal["1p1d", "colocated"] = Field(
        "1p1d", description="1p1d: prefill worker, decode worker, proxy; colocated: one vLLM server doing both."
    )
    model: ModelSettings = Field(default_factory=ModelSettings)
    prefill: PrefillWorkerSettings = Field(default_factory=PrefillWorkerSettings)
    decode: DecodeWorkerSettings = Field(default_factory=DecodeWorkerSettings)
    colocated: ColocatedWorkerSettings = Field(default_factory=ColocatedWorkerSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    run_dir: Path = Field(default_factory=lambda: default_home() / "run")
    ready_timeout_s: float = Field(600.0, description="Give up if a child is not ready by then.")
    restart: Literal["on-failure", "never"] = Field(
        "on-failure",
        description="on-failure: a worker or the proxy that exits is started again, with backoff "
        "(the proxy readmits a worker once its health and pairing checks pass); never: the stack stops at the "
        "first exit (fail fast).",
    )
    max_restarts: int = Field(
        5,
        ge=0,
        description="Exits of one child within restart_window_s it is restarted after; one more stops "
        "the stack with an error naming the child and its log's tail.",
    )
    restart_window_s: float = Field(600.0, gt=0, description="The window max_restarts counts exits in.")
    restart_backoff_s: float = Field(
        1.0, gt=0, description="Pause before a child's restart; doubles with each exit in the window (60 s at most)."
    )
    metrics_port: int | None = Field(
        None,
        description="Serve the supervisor's /metrics (pdspec_supervisor_restarts_total{child}) on this port "
        "of 127.0.0.1; unset: off.",
    )


class DraftsCommand(_Base):
    """`pdspec drafts`: switch a running worker's drafts policy (read every engine step)."""

    role: Literal["prefill", "decode"]
    policy: DraftsPolicy
    run_dir: Path = Field(default_factory=lambda: default_home() / "run")


class PlanCommand(_Base):
    """`pdspec plan`: size a P/D fleet with speculative decoding for a workload and an SLO, by
    simulating every layout of the GPUs and every K on an engine profile (pdspec/plan/)."""

    profile: str = Field(
        description="The engine profile: the name of one shipped with pdspec (pdspec/plan/profiles/<name>.json) "
        "or a profile file's path (schema pdspec.engine-profile/1)."
    )
    gpus: int = Field(ge=1, le=64, description="GPUs of the fleet, one engine each.")
    isl: int = Field(1024, ge=1, description="Prompt tokens of every request (unless workload is set).")
    osl: int = Field(256, ge=1, description="Output tokens of every request (unless workload is set).")
    workload: Path | None = Field(
        None,
        description="A JSON list of requests ({arrival_s, isl, osl}): the trials draw their (ISL, OSL) pairs from "
        "it in place of isl and osl; arrivals stay Poisson at each trial's rate.",
    )
    slo_ttft_p90_ms: float = Field(gt=0, description="The SLO: 90% of requests get their first token within this.")
    slo_tpot_p90_ms: float = Field(
        gt=0, description="The SLO: 90% of requests take at most this per output token after the first."
    )
    max_num_seqs: int = Field(
        256, ge=1, description="Requests one engine batches at most (vLLM's max_num_seqs), in the model and the output."
    )
    acceptance_rate: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Each draft's chance of acceptance on your prompts (given the drafts before it were accepted): "
        "each K's tokens per step become (1 - a^(K+1)) / (1 - a) instead of the profile's measured ones. Needed with "
        "profiles measured on random weights (their drafts are all rejected: 1.0 at every K); vLLM's "
        "spec-decode metrics on a running decode worker give it (accepted drafts per position).",
    )
    requests_per_trial: int = Field(
        200,
        ge=10,
        description="Requests measured in each simulated trial (after and before as many as the fleet holds): "
        "more give a steadier answer, slower.",
    )
    seed: int = Field(0, description="The trials' arrivals and shapes: the same seed, the same plan.")
    emit: Literal["none", "toml", "compose", "k8s"] = Field(
        "none",
        description="Write the recommended layout as a deployment: toml (a `pdspec up` config), compose (an "
        "override for docker-compose.yml) or k8s (a kustomization over deploy/k8s). Compose and k8s have no colocated "
        "workers: an aggregated plan is written as toml only.",
    )
    out: Path | None = Field(
        None,
        description="Where emit writes: a file for toml and compose, a folder for k8s. Unset: pdspec-plan.toml, "
        "docker-compose.plan.yml or pdspec-plan-k8s/ in the current folder.",
    )
    k8s_base: Path | None = Field(
        None,
        description="emit k8s: the kustomization the emitted one patches. Unset: deploy/k8s/overlays/cpu for a CPU "
        "profile, deploy/k8s/overlays/gpu-1p1d otherwise (from the repository's root).",
    )
    plot: Path | None = Field(
        None,
        description="Also draw goodput against the P:D split, one line per K, into this PNG (needs matplotlib: "
        "the bench extra).",
    )
