"""`python -m loadtest.routing_bench`, as the README types it: the tool lives in `loadtest.serving.routing_bench`."""

from loadtest.serving.routing_bench import main

if __name__ == "__main__":
    main()
