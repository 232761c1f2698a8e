"""The test-only hooks (pdspec/worker/engine/testing_hooks.py), on stand-in runners: the
prefill worker's skip-drafter switch, the decode worker's dump of the drafter KV it
received, and the pause of either role's steps."""

import threading
import types

from pdspec.worker.engine import testing_hooks


class FakeV1Runner:
    device = "cpu"

    def __init__(self):
        import torch

        self.input_batch = types.SimpleNamespace(req_ids=["a", "b"])
        self.drafter_runs = 0
        self.drafter = types.SimpleNamespace(_draft_attn_layer_names={"drafter.attn"})
        self.drafter_kv = torch.ones(4)
        self.target_kv = torch.ones(4)
        context = {
            "drafter.attn": types.SimpleNamespace(kv_cache=[self.drafter_kv]),
            "target.attn": types.SimpleNamespace(kv_cache=[self.target_kv]),
        }
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
        context = {
            "drafter.attn": types.SimpleNamespace(kv_cache=self.drafter_kv),
            "target.attn": types.SimpleNamespace(kv_cache=torch.zeros(8, 2, 4, 6)),
        }
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context)
        )
        group = types.SimpleNamespace(
            layer_names=["target.attn", "drafter.attn"], kv_cache_spec=types.SimpleNamespace(block_size=4)
        )
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
    step = types.SimpleNamespace(
        scheduled_new_reqs=[
            new_request(received + [99], [5, 2, 7, 1], 12),
            new_request([1, 2, 3], [3], 0),  # computed here from the start: nothing received
        ]
    )
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


class FakeSteppingRunner:
    def __init__(self):
        self.steps = 0

    def execute_model(self, scheduler_output, *args):
        self.steps += 1
        return "output"


def test_a_step_waits_while_the_pause_file_exists_and_goes_on_once_it_is_gone(tmp_path):
    pause = tmp_path / "test-pause-steps"
    testing_hooks.install_pause_steps(FakeSteppingRunner, pause)
    runner = FakeSteppingRunner()
    assert runner.execute_model(None) == "output" and runner.steps == 1  # no file: no wait
    pause.touch()
    step = threading.Thread(target=runner.execute_model, args=(None,))
    step.start()
    step.join(timeout=0.3)
    assert step.is_alive() and runner.steps == 1  # held before the step ran
    pause.unlink()
    step.join(timeout=10)
    assert not step.is_alive() and runner.steps == 2
