import subprocess
import sys


def test_proxy_imports_neither_vllm_nor_torch():
    code = (
        "import sys, proxy.app, proxy.serve, pdspec.cli;"
        "heavy = [m for m in ('vllm', 'torch', 'transformers', 'nixl') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_a_proxy_without_routing_tokenizer_imports_neither_tokenizers_nor_jinja2():
    # Only a proxy that tokenizes itself (routing.tokenizer, cache-aware routing) needs them.
    code = (
        "import sys, proxy.app, proxy.serve, pdspec.cli;"
        "print(','.join(m for m in ('tokenizers', 'jinja2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
