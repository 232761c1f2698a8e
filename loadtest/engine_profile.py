"""`python -m loadtest.engine_profile`, as the docs type it: the tool lives in `loadtest.engine_bench.engine_profile`."""

from loadtest.engine_bench.engine_profile import main

if __name__ == "__main__":
    main()
