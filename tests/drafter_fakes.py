"""Stand-ins for an EAGLE3 drafter and vLLM's V1 EAGLE proposer, as far as the KV-only pass
reads them (tests/unit/prefill_worker/engine/kv_only/: the EAGLE3 pass, its kernels, and the
DFlash proposer built on the same V1 proposer)."""

import types

import torch


class Backend:
    forward_includes_kv_cache_update = False


class Impl:
    def __init__(self):
        self.writes = []

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        self.writes.append((key.clone(), value.clone(), slot_mapping.clone()))


class QKV(torch.nn.Module):
    """Stand-in fused QKV projection (returns (output, bias) as vLLM's linear layers do)."""

    def __init__(self, hidden_in, q, kv, keep_weight=True):
        super().__init__()
        self.quant_method = type("UnquantizedLinearMethod", (), {})()
        weight = torch.randn(q + 2 * kv, hidden_in)
        self.full = weight.clone()
        self.weight = torch.nn.Parameter(weight if keep_weight else torch.empty(0), requires_grad=False)
        self.bias = None

    def forward(self, x):
        return torch.nn.functional.linear(x, self.full), None


def fake_drafter(class_name="Eagle3LlamaForCausalLM", layers=1, backend=Backend):
    hidden, heads, kv_heads, head = 8, 2, 1, 4
    attn_layer = types.SimpleNamespace(
        impl=Impl(),
        attn_backend=backend,
        kv_cache=torch.zeros(1),
        layer_name="model.layers.4.self_attn.attn",
        num_kv_heads=kv_heads,
        head_size=head,
        head_size_v=head,
        kv_sharing_target_layer_name=None,
    )

    def rotary(positions, query, key=None):
        return query * 2, key  # stand-in: a visible change to K only

    self_attn = types.SimpleNamespace(
        attn=attn_layer,
        q_size=heads * head,
        kv_size=kv_heads * head,
        rotary_emb=rotary,
        qkv_proj=QKV(2 * hidden, heads * head, kv_heads * head),
    )

    def norm(x, residual=None):
        return (x + 1, residual) if residual is not None else x + 1

    layer = types.SimpleNamespace(
        layer_idx=0, self_attn=self_attn, input_layernorm=norm, hidden_norm=lambda hidden_states: hidden_states
    )
    inner = types.SimpleNamespace(
        layers=[layer] * layers, embed_input_ids=lambda ids: torch.ones(len(ids), hidden), norm_output=False
    )
    cls = type(class_name, (), {"combine_hidden_states": lambda self, h: h[:, :hidden]})
    model = cls()
    model.model = inner
    return model


class FakeV1Proposer:
    method = "eagle3"
    needs_extra_input_slots = False
    supports_mm_inputs = False
    uses_mrope = False
    device = "cpu"

    def __init__(self, model):
        self.model = model
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_size=1))
        self.input_ids = torch.zeros(16, dtype=torch.int64)
        self.positions = torch.zeros(16, dtype=torch.int64)
        self.hidden_states = torch.zeros(16, 8)
        self.calls = []

    def propose(self, num_speculative_tokens, **kwargs):
        self.calls.append(("full", num_speculative_tokens))
        return torch.zeros(1, num_speculative_tokens, dtype=torch.int64)

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
        self.input_ids[: n - 1] = target_token_ids[1:]
        self.input_ids[n - 1] = next_token_ids[0]
        self.positions[:n] = target_positions
        self.hidden_states[:n] = target_hidden_states
        return n, None, cad

    def _get_positions(self, n):
        return self.positions[:n]

    def _get_slot_mapping(self, n, slot_mapping):
        return {"model.layers.4.self_attn.attn": slot_mapping[:n]}

    def _pdspec_kv_only_pass(self, kv_pass, *args):
        self.calls.append(("kv-only",))
        kv_pass.run(*args)


def v1_call(proposer, k):
    cad = types.SimpleNamespace(batch_size=lambda: 1, slot_mapping=torch.arange(100, 104))
    return proposer.propose(
        k,
        target_token_ids=torch.tensor([1, 2, 3, 4]),
        target_positions=torch.arange(4),
        target_hidden_states=torch.randn(4, 24),
        next_token_ids=torch.tensor([9]),
        token_indices_to_sample=None,
        common_attn_metadata=cad,
        sampling_metadata=None,
    )
