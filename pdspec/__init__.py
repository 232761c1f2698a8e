"""pdspec: disaggregated prefill/decode serving for vLLM with speculative decoding."""

__version__ = "0.1.0"
