"""`python -m loadtest.hostile_clients`, as the README types it: the tool lives in `loadtest.serving.hostile_clients`."""

from loadtest.serving.hostile_clients import main

if __name__ == "__main__":
    main()
