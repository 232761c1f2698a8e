"""The project's own small models: a Qwen3-architecture target and an EAGLE3 drafter.

No model hub is reachable where pdspec is developed and tested, so the local default
and the tests run on models that pdspec builds itself (see `build.py`).
"""
