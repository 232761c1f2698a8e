"""`python -m loadtest.kv_only_equality`, as the README types it: the tool lives in `loadtest.correctness.kv_only_equality`."""

from loadtest.correctness.kv_only_equality import main

if __name__ == "__main__":
    main()
