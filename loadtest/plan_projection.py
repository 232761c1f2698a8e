"""`python -m loadtest.plan_projection`, as the docs type it: the tool lives in `loadtest.serving.plan_projection`."""

from loadtest.serving.plan_projection import main

if __name__ == "__main__":
    main()
