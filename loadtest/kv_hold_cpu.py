"""`python -m loadtest.kv_hold_cpu`, as the README types it: the tool lives in `loadtest.serving.kv_hold_cpu`."""

from loadtest.serving.kv_hold_cpu import main

if __name__ == "__main__":
    main()
