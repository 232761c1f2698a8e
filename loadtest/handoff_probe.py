"""`python -m loadtest.handoff_probe`, as the README types it: the tool lives in `loadtest.serving.handoff_probe`."""

from loadtest.serving.handoff_probe import main

if __name__ == "__main__":
    main()
