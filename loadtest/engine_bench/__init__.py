"""In-process engine benchmarks: engines built as pdspec's workers build them, the prefill-only K=0 benchmark, the K=0 step profiler."""
