"""`python -m loadtest.fleet_bench`, as the README types it: the tool lives in `loadtest.serving.fleet_bench`."""

from loadtest.serving.fleet_bench import main

if __name__ == "__main__":
    main()
