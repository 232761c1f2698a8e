"""`python -m loadtest.client_check`: the tool lives in `loadtest.serving.client_check`."""

from loadtest.serving.client_check import main

if __name__ == "__main__":
    main()
