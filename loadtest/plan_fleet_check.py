"""`python -m loadtest.plan_fleet_check`, as the docs type it: the tool lives in `loadtest.serving.plan_fleet_check`."""

from loadtest.serving.plan_fleet_check import main

if __name__ == "__main__":
    main()
