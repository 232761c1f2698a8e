"""`pdspec models` is deterministic and produces what vLLM expects to load."""

import hashlib
import json

import pytest

from pdspec.models.build import build_models, is_built
from pdspec.models.shapes import ModelSpec

SMALL = ModelSpec(corpus_bytes=300_000)


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("a") / "models", SMALL)


def test_two_builds_are_byte_identical(built, tmp_path):
    again = build_models(tmp_path / "models", SMALL)
    assert digest(built) == digest(again)


def test_a_built_folder_is_reused_and_a_changed_spec_rebuilds(built):
    assert is_built(built, SMALL)
    assert not is_built(built, ModelSpec(corpus_bytes=123))


def test_drafter_matches_the_target(built):
    target = json.loads((built / "target" / "config.json").read_text())
    drafter = json.loads((built / "eagle3" / "config.json").read_text())
    assert target["architectures"] == ["Qwen3ForCausalLM"]
    assert drafter["architectures"] == ["LlamaForCausalLMEagle3"]
    assert drafter["target_hidden_size"] == target["hidden_size"]
    assert drafter["vocab_size"] == target["vocab_size"]
    assert max(drafter["eagle_aux_hidden_state_layer_ids"]) < target["num_hidden_layers"]


def test_tokenizer_has_a_chat_template_and_round_trips(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built / "target")
    text = "def f(x):\n    return x + 1\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"
