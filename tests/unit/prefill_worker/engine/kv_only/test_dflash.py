"""The DFlash KV-only pass's wiring (prefill_worker/engine/kv_only/dflash.py), on stand-in
proposers (no engine): V1 K=0 proposals write the context K/V from vLLM's own buffers and
skip the forward, the rest keep vLLM's path; V2 K=0 steps (vLLM's own context-only path)
are counted and go to the context step's CUDA graph when one of their size was captured.
Bitwise equality with the full pass is tested on a real engine
(tests/e2e/test_kv_only_equality.py); the graph's, on a GPU
(`PDSPEC_TEST_DFLASH_GRAPH_VERIFY_STEPS`, loadtest/gpu/kv_only_h200.sh)."""

import types

import pytest
import torch

from pdspec.worker.engine import features
from pdspec.worker.engine.control import LiveFlag, write_policy
from prefill_worker.engine.kv_only import dflash
from prefill_worker.engine.kv_only.dflash import install_dflash_v2, install_kv_only_dflash_v1
from prefill_worker.engine.kv_only.dflash_context_graph import graph_sizes
from tests.drafter_fakes import FakeV1Proposer, v1_call


class FakeDFlashModel:
    def __init__(self):
        self.writes = []

    def combine_hidden_states(self, hidden):
        return torch.full_like(hidden, 2.0)

    def precompute_and_store_context_kv(self, states, positions, slots=None):
        self.writes.append((states.clone(), positions.clone(), None if slots is None else slots.clone()))


class FakeDFlashProposer(FakeV1Proposer):
    """vLLM's V1 DFlash proposer as far as the pass reads it (`propose` is vLLM's full pass)."""

    method = "dflash"

    def __init__(self):
        super().__init__(FakeDFlashModel())
        self._context_positions_buffer = torch.zeros(16, dtype=torch.int64)
        self._context_slot_mapping_buffer = torch.zeros(16, dtype=torch.int64)

    def set_inputs_first_pass(
        self,
        target_token_ids,
        next_token_ids,
        target_positions,
        target_hidden_states,
        token_indices_to_sample,
        cad,
        num_rejected_tokens_gpu,
    ):
        n = target_token_ids.shape[0]
        self._dflash_num_context = n
        self._dflash_hidden_states = target_hidden_states
        # vLLM's kernel writes the context slots apart from the query's (returned in the new
        # metadata): the pass must read the context ones.
        self._context_positions_buffer[:n] = target_positions
        self._context_slot_mapping_buffer[:n] = cad.slot_mapping[:n] + 1000
        return n + 1, None, types.SimpleNamespace(slot_mapping=torch.arange(900, 900 + n + 1))


def call(proposer, k):
    return v1_call(proposer, k)  # target ids 1-4 at positions 0-3, slots 100-103


@pytest.fixture
def proposer_class(monkeypatch):
    monkeypatch.setattr(dflash, "kv_only_connector_reason", lambda: None)
    return type("Proposer", (FakeDFlashProposer,), {})


def test_v1_k0_writes_the_context_kv_from_vllms_buffers_and_skips_the_forward(proposer_class, tmp_path):
    flag = LiveFlag(True, tmp_path / "switch")
    install_kv_only_dflash_v1(proposer_class, flag)
    install_kv_only_dflash_v1(proposer_class, flag)  # idempotent
    proposer = proposer_class()
    drafts = call(proposer, 0)
    assert drafts.shape == (1, 0)
    assert proposer.calls == [("kv-only",)]
    ((states, positions, slots),) = proposer.model.writes
    assert torch.equal(states, torch.full((4, 24), 2.0))  # combined by the drafter's fc
    assert positions.tolist() == [0, 1, 2, 3] and slots.tolist() == [1100, 1101, 1102, 1103]
    call(proposer, 4)
    assert proposer.calls[-1] == ("full", 4)
    write_policy(tmp_path / "switch", "off")
    call(proposer, 0)
    assert proposer.calls[-1] == ("full", 0)


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda p: setattr(p.vllm_config.parallel_config, "data_parallel_size", 2), "data parallelism"),
        (lambda p: setattr(p, "uses_mrope", True), "M-RoPE"),
        (lambda p: delattr(p, "_context_slot_mapping_buffer"), "lacks _context_slot_mapping_buffer"),
        (lambda p: setattr(p.model, "precompute_and_store_context_kv", None), "no context K/V precompute"),
    ],
)
def test_v1_keeps_vllms_path_where_the_pass_cannot_run_and_says_why(proposer_class, change, reason):
    install_kv_only_dflash_v1(proposer_class, LiveFlag(True, None))
    proposer = proposer_class()
    change(proposer)
    call(proposer, 0)
    assert proposer.calls == [("full", 0)]
    state, why = features.reported()[features.KV_ONLY_PASS]
    assert state == "off" and reason in why


def test_v1_keeps_vllms_path_under_a_layer_by_layer_connector(monkeypatch):
    cls = type("Proposer", (FakeDFlashProposer,), {})
    monkeypatch.setattr(dflash, "kv_only_connector_reason", lambda: "the KV connector works layer by layer")
    install_kv_only_dflash_v1(cls, LiveFlag(True, None))
    proposer = cls()
    call(proposer, 0)
    assert proposer.calls == [("full", 0)]


def test_a_failing_pass_falls_back_to_vllms_path_for_good(proposer_class):
    install_kv_only_dflash_v1(proposer_class, LiveFlag(True, None))
    proposer = proposer_class()

    def broken(*args):
        raise RuntimeError("internals differ")

    proposer._pdspec_kv_only_pass = broken
    call(proposer, 0)
    call(proposer, 0)
    assert proposer.calls == [("full", 0), ("full", 0)]
    assert features.reported()[features.KV_ONLY_PASS][0] == "off"


class FakeV2Speculator:
    """vLLM 0.33's V2 DFlash speculator as far as the wrappers read it: a K=0 `propose`
    stores the hidden states, then precomputes the context K/V (both recorded)."""

    max_num_tokens = 512

    def __init__(self):
        self.calls = []
        self.hidden_states = torch.zeros(8, 2)

    def load_model(self, target_model):
        self.loaded = target_model

    def capture(self):
        self.calls.append("vllm capture")
        return "captured"

    def _store_hidden_states(self, num_tokens, last_hidden_states, aux_hidden_states, num_graph_tokens=0):
        self.calls.append(("eager store", num_tokens))

    def _precompute_context_kv(self, start, end, dummy_run=False):
        self.calls.append(("eager precompute", start, end))

    def propose(self, num_tokens=4, *args, num_speculative_tokens=None, dummy_run=False, is_profile=False, **kwargs):
        if num_speculative_tokens == 0:
            self._store_hidden_states(num_tokens, None, [torch.ones(num_tokens, 1)] * 2)
            self._precompute_context_kv(0, num_tokens, dummy_run)
        return num_speculative_tokens


class FakeGraphs:
    """DFlashContextGraphs without CUDA: sizes it "captured", replays it did."""

    def __init__(self, sizes, fail=False):
        self.sizes, self.fail, self.replays = set(sizes), fail, []
        self.staging = torch.zeros(8, 2)
        self.model = types.SimpleNamespace(combine_hidden_states=lambda hidden: hidden + 1)

    def stage(self, num_tokens, aux):
        return num_tokens in self.sizes

    def replay(self, num_tokens):
        if self.fail:
            raise RuntimeError("graph replay failed")
        self.replays.append(num_tokens)


def v2_speculator(graphs=None, flag=True):
    cls = type("Speculator", (FakeV2Speculator,), {})
    install_dflash_v2(cls, LiveFlag(flag, None))
    speculator = cls()
    speculator._pdspec_context_graphs = graphs
    return speculator


def test_v2_k0_step_of_a_captured_size_replays_its_graph_instead_of_vllms_eager_path():
    graphs = FakeGraphs({4})
    speculator = v2_speculator(graphs)
    speculator.propose(4, num_speculative_tokens=0)
    assert graphs.replays == [4]
    assert speculator.calls == []  # neither vLLM's store nor its precompute ran


@pytest.mark.parametrize(
    "call",
    [
        dict(num_tokens=3, num_speculative_tokens=0),  # a size with no graph
        dict(num_tokens=4, num_speculative_tokens=0, dummy_run=True),
        dict(num_tokens=4, num_speculative_tokens=0, is_profile=True),
    ],
)
def test_v2_other_k0_steps_keep_vllms_eager_path(call):
    graphs = FakeGraphs({4})
    speculator = v2_speculator(graphs)
    speculator.propose(**call)
    assert graphs.replays == []
    assert speculator.calls == [("eager store", call["num_tokens"]), ("eager precompute", 0, call["num_tokens"])]


def test_v2_graph_not_used_with_the_switch_off_or_when_drafting():
    graphs = FakeGraphs({4})
    off = v2_speculator(graphs, flag=False)
    off.propose(4, num_speculative_tokens=0)
    assert graphs.replays == [] and ("eager precompute", 0, 4) in off.calls
    drafting = v2_speculator(graphs)
    drafting.propose(4, num_speculative_tokens=16)
    assert graphs.replays == [] and drafting.calls == []


def test_v2_a_failing_replay_runs_vllms_path_for_that_step_and_drops_the_graphs():
    graphs = FakeGraphs({4}, fail=True)
    speculator = v2_speculator(graphs)
    speculator.propose(4, num_speculative_tokens=0)
    assert speculator.calls == [("eager precompute", 0, 4)]
    assert torch.equal(speculator.hidden_states[:4], torch.ones(4, 2))  # the fc of the staged rows, as vLLM's store
    assert speculator._pdspec_context_graphs is None
    speculator.propose(4, num_speculative_tokens=0)
    assert speculator.calls[1:] == [("eager store", 4), ("eager precompute", 0, 4)]


class FakeDFlashDrafter(torch.nn.Module):
    """The unwrapped drafter as the graphs read it: fc's input width, the fc itself."""

    def __init__(self):
        super().__init__()
        self.model = types.SimpleNamespace(fc=types.SimpleNamespace(input_size=2), _attn_layers=[])

    def combine_hidden_states(self, hidden):
        return hidden[:, :2] * 10


def capturable_speculator():
    speculator = v2_speculator()
    speculator.model = FakeDFlashDrafter()
    speculator.max_num_tokens = 8
    speculator._context_slot_mappings = torch.zeros(1, 8, dtype=torch.int64)
    speculator.vllm_config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 16])
    )
    return speculator


def test_v2_capture_keeps_vllms_result_and_leaves_the_eager_path_where_graphs_cannot_be_made():
    """On this CPU no CUDA graph can be captured (the graph pool is CUDA's): vLLM's capture
    still runs and returns, and K=0 steps keep vLLM's eager path."""
    speculator = capturable_speculator()
    assert speculator.capture() == "captured"
    assert speculator.calls == ["vllm capture"]
    assert speculator._pdspec_context_graphs is None
    speculator.propose(4, num_speculative_tokens=0)
    assert speculator.calls[1:] == [("eager store", 4), ("eager precompute", 0, 4)]


class FakeCudaGraph:
    """torch.cuda.CUDAGraph on the CPU: the "capture" is the body run once, eagerly; replays counted."""

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_v2_graphs_are_captured_per_size_and_a_k0_step_stages_vllms_concatenation_then_replays(monkeypatch):
    """The real DFlashContextGraphs with CUDA's graph API stood in: one graph per size (the
    token budget and the capture sizes under it), each captured after a warm-up over PAD
    slots; a K=0 step concatenates the aux hidden states into the fixed buffer and replays
    that size's graph, and vLLM's store and precompute do not run."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCudaGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    speculator = capturable_speculator()
    speculator._context_slot_mappings.fill_(7)
    speculator.capture()
    graphs = speculator._pdspec_context_graphs
    assert sorted(graphs.graphs) == [1, 2, 4, 8]
    assert int(speculator._context_slot_mappings.max()) == -1  # PAD: capture writes no KV
    # Each size: a warm-up and the capture ran vLLM's own precompute over that many rows.
    assert speculator.calls[1:] == [("eager precompute", 0, n) for n in (8, 8, 4, 4, 2, 2, 1, 1)]
    speculator.calls.clear()
    speculator.propose(4, num_speculative_tokens=0)  # aux: two [4, 1] tensors of ones
    assert speculator.calls == []
    assert graphs.graphs[4].replays == 1
    assert torch.equal(graphs.staging[:4], torch.ones(4, 2))  # vLLM's concatenation, staged


def test_graph_sizes_are_the_token_budget_and_the_capture_sizes_below_it_largest_first():
    assert graph_sizes(512, [1, 2, 4, 512, 1024]) == [512, 4, 2, 1]
    assert graph_sizes(2048, [8, 512]) == [2048, 512, 8]
    assert graph_sizes(64, None) == [64]


def test_v2_counts_k0_steps_of_vllms_context_only_path():
    cls = type("Speculator", (FakeV2Speculator,), {})
    install_dflash_v2(cls)
    install_dflash_v2(cls)  # idempotent: one count a step
    speculator = cls()
    speculator.load_model("target")
    assert features.reported()[features.KV_ONLY_PASS] == ("on", "")
    before = features.KV_ONLY_PASSES._value.get()
    speculator.propose(num_speculative_tokens=0)
    speculator.propose(num_speculative_tokens=16)
    speculator.propose(num_speculative_tokens=0, dummy_run=True)
    speculator.propose(num_speculative_tokens=0, is_profile=True)
    assert features.KV_ONLY_PASSES._value.get() - before == 1


def test_the_runner_tells_its_speculator_which_capture_measures_memory():
    from prefill_worker.engine.kv_only.dflash import install_profile_capture_mark

    seen = []

    class Runner:
        def __init__(self):
            self.speculator = types.SimpleNamespace()

        def capture_model(self, *, profile_only=False):
            seen.append(self.speculator._pdspec_profile_capture)
            return 0

    install_profile_capture_mark(Runner)
    runner = Runner()
    runner.capture_model(profile_only=True)
    runner.capture_model()
    assert seen == [True, False]
    assert runner.speculator._pdspec_profile_capture is False
