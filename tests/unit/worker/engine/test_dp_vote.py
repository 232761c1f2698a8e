"""Engine-plugin pieces that need no running engine: the live policy switch, version
detection, and the idle-DP-rank vote wiring (on stand-in worker/runner classes)."""

import os
import types

import pytest

from pdspec.worker.engine import capabilities, control, cpu_affinity, dp_vote, kv_only, metrics, testing_hooks
from pdspec.worker.engine.control import DraftsPolicySource, write_policy
from pdspec.worker.engine.cpu_affinity import KV_CORE_MARKER
from pdspec.worker.engine.dp_vote import install_idle_rank_vote
from pdspec.worker.engine.wrap_once import is_wrapped


def test_policy_file_switches_a_running_engine(tmp_path):
    path = tmp_path / "drafts-policy"
    source = DraftsPolicySource("auto", path)
    assert source.current() == "auto"  # no file yet: the start-up setting
    write_policy(path, "always")
    assert source.current() == "always"
    write_policy(path, "auto")
    os.utime(path, ns=(1, 1))  # make sure the change is seen even within one mtime tick
    assert source.current() == "auto"


def test_unknown_policy_keeps_the_current_one(tmp_path):
    path = tmp_path / "drafts-policy"
    path.write_text("sometimes")
    assert DraftsPolicySource("always", path).current() == "always"


def test_unknown_vllm_version_is_refused(monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "__version__", "0.40.0")
    with pytest.raises(capabilities.UnsupportedVllmError, match="0.40.0"):
        capabilities.detect_capabilities(types.SimpleNamespace(use_v2_model_runner=False))


def test_cpu_build_uses_the_k_override():
    pytest.importorskip("vllm")
    caps = capabilities.detect_capabilities(types.SimpleNamespace(use_v2_model_runner=False))
    assert caps.native_skip is False


V2_PROPOSE_INPUTS = ("input_batch", "attn_metadata", "slot_mappings", "last_hidden_states", "aux_hidden_states",
                     "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens", "temperature", "seeds")


class FakeSpeculator:
    def __init__(self):
        self.ks = []  # the K of each propose call, None: vLLM's full K

    def propose(self, *args, dp_sync_state=None, dummy_run=False, num_speculative_tokens=None, **kwargs):
        self.ks.append(num_speculative_tokens)


class FakeRunner:
    """As vLLM 0.33's V2 runner: a step with a forward leaves a new execute_model_state
    holding its K, zero when the ranks agreed to skip drafts. A dummy run proposes after
    its forward, with the agreement and no K."""

    def __init__(self):
        self.votes = []
        self.execute_model_state = None
        self.speculator = FakeSpeculator()

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False, **kwargs):
        self.votes.append(scheduler_output.skip_drafts)
        if getattr(scheduler_output, "tokens", 1):
            k = 0 if getattr(scheduler_output, "agreed_skip", scheduler_output.skip_drafts) else 3
            self.execute_model_state = types.SimpleNamespace(num_spec_tokens_to_schedule=k)

    def _dummy_run(self, num_tokens, busy_rank_skips=True, **kwargs):
        output = types.SimpleNamespace(skip_drafts=False)
        self.execute_model(output, dummy_run=True)
        sync = types.SimpleNamespace(skip_drafts=output.skip_drafts and busy_rank_skips)  # ranks AND their votes
        inputs = dict.fromkeys(V2_PROPOSE_INPUTS)  # vLLM passes every input by name
        self.speculator.propose(**inputs, dp_sync_state=sync, dummy_run=True)


class FakeWorker:
    def __init__(self):
        self.model_runner = FakeRunner()

    def execute_dummy_batch(self, busy_rank_skips=True):
        self.model_runner._dummy_run(1, busy_rank_skips=busy_rank_skips, uniform_decode=True)

    def warm_up(self):
        self.model_runner._dummy_run(16)

    def compile_or_warm_up_model(self):
        # as vLLM 0.33's kernel warm-up: real-looking steps (not dummy runs) with K>0
        self.model_runner.execute_model(types.SimpleNamespace(skip_drafts=False))


def fresh_classes():
    """Subclasses to patch, so each test installs on classes of its own."""
    runner = type("Runner", (FakeRunner,), {})
    worker = type("Worker", (FakeWorker,), {"__init__": lambda self: setattr(self, "model_runner", runner())})
    return worker, runner


def test_idle_rank_dummy_batch_votes_skip_but_warmup_does_not():
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls)
    install_idle_rank_vote(worker_cls, runner_cls)  # idempotent
    worker = worker_cls()
    worker.execute_dummy_batch()  # the DP-idle path
    worker.warm_up()  # other dummy runs keep vLLM's vote
    worker.model_runner.execute_model(types.SimpleNamespace(skip_drafts=False))  # a real step
    assert worker.model_runner.votes == [True, False, False]


def test_idle_rank_dummy_proposes_with_the_k_the_ranks_agreed_on():
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls)
    worker = worker_cls()
    worker.execute_dummy_batch()  # the busy rank skips too: the dummy drafter runs K=0, as it does
    worker.execute_dummy_batch(busy_rank_skips=False)  # a busy rank drafts: vLLM's K
    worker.warm_up()  # not an idle rank's dummy: untouched
    assert worker.model_runner.speculator.ks == [0, None, None]
    worker.execute_dummy_batch()  # wrapped once: still one K per call
    assert worker.model_runner.speculator.ks == [0, None, None, 0]


def test_idle_rank_dummy_follows_the_agreement_under_the_kv_only_wrapper():
    # On a GPU prefill worker the speculator class's propose is already pdspec's
    # (the KV-only pass), with that wrapper's own marker.
    class KvOnlyWrapped(FakeSpeculator):
        pass

    kv_only.install_kv_only_v2(KvOnlyWrapped)
    assert is_wrapped(KvOnlyWrapped.propose, "kv_only_v2")
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls)
    worker = worker_cls()
    worker.model_runner.speculator = KvOnlyWrapped()
    worker.execute_dummy_batch()
    assert worker.model_runner.speculator.ks == [0]


def test_without_the_vote_an_idle_rank_keeps_vllms_draft_vote():
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls, vote=False)
    worker = worker_cls()
    worker.execute_dummy_batch()
    assert worker.model_runner.votes == [False]


def counted():
    return metrics.RUNNER_PROPOSALS._value.get(), metrics.RUNNER_K0_PROPOSALS._value.get()


def test_runner_counts_the_k_its_real_steps_ran_with_after_the_dp_agreement():
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls)
    worker = worker_cls()
    runner = worker.model_runner
    start = counted()
    runner.execute_model(types.SimpleNamespace(skip_drafts=True))  # every rank skips: K=0
    runner.execute_model(types.SimpleNamespace(skip_drafts=True, agreed_skip=False))  # another rank drafts
    runner.execute_model(types.SimpleNamespace(skip_drafts=True, tokens=0))  # nothing scheduled: no step
    worker.execute_dummy_batch()  # an idle rank's dummy batch is not a step
    worker.compile_or_warm_up_model()  # nor is the kernel warm-up
    proposals, k0 = (now - then for now, then in zip(counted(), start))
    assert (proposals, k0) == (2, 1)
    no_drafter = runner_cls()
    no_drafter.speculator = None
    no_drafter.execute_model(types.SimpleNamespace(skip_drafts=True))
    assert counted() == (start[0] + 2, start[1] + 1)


def test_runner_counts_a_step_once_whatever_the_tensor_parallel_size(monkeypatch):
    worker_cls, runner_cls = fresh_classes()
    install_idle_rank_vote(worker_cls, runner_cls)
    start = counted()
    for rank in (0, 1):  # each TP rank's runner executes the same step
        monkeypatch.setattr(dp_vote, "_tensor_parallel_rank", lambda rank=rank: rank)
        runner_cls().execute_model(types.SimpleNamespace(skip_drafts=True))
    assert counted() == (start[0] + 1, start[1] + 1)


class FakeV1Runner:
    device = "cpu"

    def __init__(self):
        import torch

        self.input_batch = types.SimpleNamespace(req_ids=["a", "b"])
        self.drafter_runs = 0
        self.drafter = types.SimpleNamespace(_draft_attn_layer_names={"drafter.attn"})
        self.drafter_kv = torch.ones(4)
        self.target_kv = torch.ones(4)
        context = {"drafter.attn": types.SimpleNamespace(kv_cache=[self.drafter_kv]),
                   "target.attn": types.SimpleNamespace(kv_cache=[self.target_kv])}  # fmt: skip
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context)
        )

    def propose_draft_token_ids(self, scheduler_output, *args):
        self.drafter_runs += 1
        return "drafts"


def test_skip_drafter_prefill_switch_is_live(tmp_path):
    switch = tmp_path / "test-skip-drafter-prefill"
    testing_hooks.install_skip_drafter_prefill(FakeV1Runner, switch)
    runner = FakeV1Runner()
    assert runner.propose_draft_token_ids(None) == "drafts"
    switch.touch()
    skipped = runner.propose_draft_token_ids(None)
    assert tuple(skipped.shape) == (2, 0) and runner.drafter_runs == 1  # the drafter did not run
    assert runner.drafter_kv.sum() == 0 and runner.target_kv.sum() == 4  # only drafter KV zeroed
    switch.unlink()
    assert runner.propose_draft_token_ids(None) == "drafts" and runner.drafter_runs == 2


class FakeDecodeRunner:
    """A decode runner with one target and one drafter layer, 8 blocks of 4 tokens, laid out
    as vLLM's CPU backend lays out its cache (block first)."""

    def __init__(self):
        import torch

        self.drafter = types.SimpleNamespace(_draft_attn_layer_names={"drafter.attn"})
        self.drafter_kv = torch.arange(8 * 2 * 4 * 6, dtype=torch.float32).view(8, 2, 4, 6)
        context = {"drafter.attn": types.SimpleNamespace(kv_cache=self.drafter_kv),
                   "target.attn": types.SimpleNamespace(kv_cache=torch.zeros(8, 2, 4, 6))}  # fmt: skip
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context)
        )
        group = types.SimpleNamespace(layer_names=["target.attn", "drafter.attn"],
                                      kv_cache_spec=types.SimpleNamespace(block_size=4))  # fmt: skip
        self.kv_cache_config = types.SimpleNamespace(kv_cache_groups=[group], num_blocks=8)
        self.seen_drafter_kv = None

    def execute_model(self, scheduler_output, *args):
        self.seen_drafter_kv = self.drafter_kv.clone()
        self.drafter_kv.fill_(-1)  # this step's own writes: the dump must not see them
        return "output"


def new_request(prompt, block_ids, computed):
    return types.SimpleNamespace(prompt_token_ids=prompt, block_ids=(block_ids,), num_computed_tokens=computed)


def test_decode_dump_saves_the_received_full_blocks_before_the_step_runs(tmp_path):
    import torch

    dump_dir = tmp_path / "dump"
    testing_hooks.install_dump_received_drafter_kv(FakeDecodeRunner, dump_dir)
    runner = FakeDecodeRunner()
    received = list(range(12))  # 12 tokens received, 13-token prompt: blocks 5, 2, 7 full
    step = types.SimpleNamespace(scheduled_new_reqs=[
        new_request(received + [99], [5, 2, 7, 1], 12),
        new_request([1, 2, 3], [3], 0),  # computed here from the start: nothing received
    ])  # fmt: skip
    assert runner.execute_model(step) == "output" and not dump_dir.exists()  # switched off
    runner = FakeDecodeRunner()
    dump_dir.mkdir()
    before = runner.drafter_kv.clone()
    assert runner.execute_model(step) == "output"
    files = list(dump_dir.glob("*.pt"))
    assert [f.stem for f in files] == [testing_hooks.prompt_key(received + [99])]
    dump = torch.load(files[0])
    assert (dump["num_computed_tokens"], dump["block_size"]) == (12, 4)
    assert torch.equal(dump["layers"]["drafter.attn"], before[[5, 2, 7]])  # not the step's -1s

    step = types.SimpleNamespace(scheduled_new_reqs=[new_request(list(range(8)), [0, 1], 7)])
    runner.execute_model(step)  # the block of the last prompt token is recomputed: left out
    dump = torch.load(dump_dir / f"{testing_hooks.prompt_key(list(range(8)))}.pt")
    assert dump["layers"]["drafter.attn"].shape[0] == 1


# --- CPU: NixlConnector's KV core stays among the worker's own cores ---------------


def test_kv_core_is_chosen_among_the_allowed_cores():
    nodes = [[0, 1], [2, 3]]
    assert cpu_affinity.cores_within(nodes, {0}) == [[0]]
    assert cpu_affinity.cores_within(nodes, {1, 2}) == [[1], [2]]
    assert cpu_affinity.cores_within(nodes, {0, 1, 2, 3}) == nodes  # unbound: vLLM's answer
    assert cpu_affinity.cores_within(nodes, {7}) == nodes  # nothing allowed: keep vLLM's


def test_real_cpu_platform_picks_the_workers_own_core(monkeypatch):
    """On vLLM's own CpuPlatform: a worker bound to core 0 gets core 0 as its KV core,
    where unpatched vLLM picks the node's last core (the decode worker's core here)."""
    pytest.importorskip("vllm")
    from vllm.platforms.cpu import CpuPlatform

    nodes = CpuPlatform.discover_numa_topology()
    all_cores = sorted(core for node in nodes for core in node)
    if len(all_cores) < 2:
        pytest.skip("needs a machine with at least two cores")  # CI and this machine have 2
    first = all_cores[0]
    assert [max(node) for node in nodes] != [first]  # the bug: vLLM's choice ignores the binding
    monkeypatch.setattr(CpuPlatform, "discover_numa_topology", CpuPlatform.discover_numa_topology)
    assert cpu_affinity.install_kv_core_within_own_cpus(CpuPlatform)
    assert not cpu_affinity.install_kv_core_within_own_cpus(CpuPlatform)  # idempotent
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {first})
    assert [max(node) for node in CpuPlatform.discover_numa_topology()] == [first]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(all_cores))
    assert CpuPlatform.discover_numa_topology() == nodes


@pytest.fixture
def affinity_classes(monkeypatch):
    """vLLM's CPU platform and NIXL worker classes, restored after the test patches them."""
    pytest.importorskip("vllm")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.setattr(CpuPlatform, "discover_numa_topology", CpuPlatform.discover_numa_topology)
    monkeypatch.setattr(NixlBaseConnectorWorker, "__init__", NixlBaseConnectorWorker.__init__)
    return CpuPlatform, NixlBaseConnectorWorker


def test_affinity_fix_is_installed_only_for_pd_workers(monkeypatch, affinity_classes):
    CpuPlatform, _ = affinity_classes  # noqa: N806
    monkeypatch.setenv(control.ROLE_ENV, "colocated")
    cpu_affinity.install_cpu_affinity_fix()
    assert not is_wrapped(CpuPlatform.discover_numa_topology, KV_CORE_MARKER)
    monkeypatch.setenv(control.ROLE_ENV, "prefill")
    cpu_affinity.install_cpu_affinity_fix()
    assert is_wrapped(CpuPlatform.discover_numa_topology, KV_CORE_MARKER)


def test_main_thread_gets_its_cores_back_after_the_connector_pins_it(monkeypatch):
    affinity = {"now": {0, 1, 2, 3}}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity["now"]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: affinity.update(now=set(cores)))
    seen_inside = []

    class FakeNixlWorker:
        def __init__(self, kv_cores):
            os.sched_setaffinity(0, kv_cores)  # what vLLM's NixlConnector worker does
            seen_inside.append(os.sched_getaffinity(0))  # NIXL's threads start here

    assert cpu_affinity.install_affinity_restore(FakeNixlWorker)
    assert not cpu_affinity.install_affinity_restore(FakeNixlWorker)
    FakeNixlWorker([3])
    assert seen_inside == [{3}]  # NIXL's threads still get the KV core
    assert affinity["now"] == {0, 1, 2, 3}  # the main thread its own cores back


def test_affinity_restore_wraps_vllms_nixl_worker(monkeypatch, affinity_classes):
    _, NixlBaseConnectorWorker = affinity_classes  # noqa: N806
    monkeypatch.setenv(control.ROLE_ENV, "decode")
    cpu_affinity.install_cpu_affinity_fix()
    assert is_wrapped(NixlBaseConnectorWorker.__init__, "cpu_affinity_restore")
