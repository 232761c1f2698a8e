"""`python -m loadtest.routing_compare`, as the README types it: the tool lives in `loadtest.serving.routing_compare`."""

from loadtest.serving.routing_compare import main

if __name__ == "__main__":
    main()
