"""`python -m loadtest.profile_k0`, as the README types it: the tool lives in `loadtest.engine_bench.profile_k0`."""

from loadtest.engine_bench.profile_k0 import main

if __name__ == "__main__":
    main()
