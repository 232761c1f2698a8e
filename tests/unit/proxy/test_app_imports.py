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
