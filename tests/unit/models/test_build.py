"""The shipped model pair: `pdspec models` installs it exactly, and it is what vLLM expects."""

import hashlib
import json

import pytest

from pdspec.models.build import MANIFEST, SHIPPED, install_models, is_installed


def digest(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return install_models(tmp_path_factory.mktemp("a") / "models")


def test_install_is_exact_and_repeatable(installed, tmp_path):
    again = install_models(tmp_path / "models")
    assert digest(installed) == digest(again)
    manifest = json.loads((SHIPPED / MANIFEST).read_text())
    assert {k: v for k, v in digest(installed).items() if k != MANIFEST} == manifest


def test_installed_folder_is_reused_and_a_tampered_one_reinstalled(installed):
    assert is_installed(installed)
    (installed / MANIFEST).write_text("{}")
    assert not is_installed(installed)
    install_models(installed)
    assert is_installed(installed)


def test_shipped_files_fit_the_size_budget():
    total = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert total <= 20 * 1024 * 1024


def test_drafter_matches_the_target(installed):
    target = json.loads((installed / "target" / "config.json").read_text())
    drafter = json.loads((installed / "eagle3" / "config.json").read_text())
    assert target["architectures"] == ["Qwen3ForCausalLM"]
    assert drafter["architectures"] == ["LlamaForCausalLMEagle3"]
    assert drafter["target_hidden_size"] == target["hidden_size"]
    assert drafter["vocab_size"] == target["vocab_size"]
    assert max(drafter["eagle_aux_hidden_state_layer_ids"]) < target["num_hidden_layers"]


def test_tokenizer_has_a_chat_template_and_round_trips(installed):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(installed / "target")
    text = "def f(x):\n    return x + 1\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


def test_eagle3_training_forward_matches_checkpoint_names(installed):
    """The training module's state dict is exactly what vLLM's Eagle3 loader reads."""
    from safetensors.torch import load_file

    from pdspec.models.eagle3 import Eagle3Drafter

    config = json.loads((installed / "eagle3" / "config.json").read_text())
    shipped = load_file(installed / "eagle3" / "model.safetensors")
    model = Eagle3Drafter(config)
    assert set(model.state_dict()) == set(shipped)
    model.load_state_dict(shipped)
