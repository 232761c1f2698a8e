"""pdspec's OpenAI-compatible P/D proxy. Imports nothing from vLLM."""
