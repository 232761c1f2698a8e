"""`python -m loadtest.fleet_trace`, as the README types it: the tool lives in `loadtest.serving.fleet_trace`."""

from loadtest.serving.fleet_trace import main

if __name__ == "__main__":
    main()
