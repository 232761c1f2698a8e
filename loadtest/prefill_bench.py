"""`python -m loadtest.prefill_bench`, as the README types it: the tool lives in `loadtest.engine_bench.prefill_bench`."""

from loadtest.engine_bench.prefill_bench import main

if __name__ == "__main__":
    main()
