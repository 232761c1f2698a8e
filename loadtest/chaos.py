"""`python -m loadtest.chaos`, as the README types it: the tool lives in `loadtest.serving.chaos`."""

from loadtest.serving.chaos import main

if __name__ == "__main__":
    main()
