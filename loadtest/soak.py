"""`python -m loadtest.soak`, as the README types it: the tool lives in `loadtest.serving.soak`."""

from loadtest.serving.soak import main

if __name__ == "__main__":
    main()
