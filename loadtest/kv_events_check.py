"""`python -m loadtest.kv_events_check`, as the README types it: the tool lives in `loadtest.serving.kv_events_check`."""

from loadtest.serving.kv_events_check import main

if __name__ == "__main__":
    main()
