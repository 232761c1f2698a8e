"""`python -m loadtest.dp_vote`, as the README types it: the tool lives in `loadtest.serving.dp_vote`."""

from loadtest.serving.dp_vote import main

if __name__ == "__main__":
    main()
