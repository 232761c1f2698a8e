"""What both vLLM workers share: launch arguments, start-up fixes, the engine plugin."""
