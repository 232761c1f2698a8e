"""`python -m loadtest.fleet_report`, as the README types it: the tool lives in `loadtest.serving.fleet_report`."""

from loadtest.serving.fleet_report import main

if __name__ == "__main__":
    main()
