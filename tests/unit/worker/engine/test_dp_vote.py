"""The data-parallel idle-rank vote and the runner's own K count (pdspec/worker/engine/dp_vote.py),
wired on stand-in worker/runner classes (no engine)."""

import types

from pdspec.worker.engine import dp_vote, metrics
from pdspec.worker.engine.dp_vote import install_idle_rank_vote
from pdspec.worker.engine.wrap_once import is_wrapped
from prefill_worker.engine.kv_only import eagle3

V2_PROPOSE_INPUTS = (
    "input_batch",
    "attn_metadata",
    "slot_mappings",
    "last_hidden_states",
    "aux_hidden_states",
    "num_sampled",
    "num_rejected",
    "last_sampled",
    "next_prefill_tokens",
    "temperature",
    "seeds",
)


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

    eagle3.install_kv_only_v2(KvOnlyWrapped)
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
