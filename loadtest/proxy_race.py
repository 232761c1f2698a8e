"""`python -m loadtest.proxy_race`: the tool lives in `loadtest.micro.proxy_race`."""

from loadtest.micro.proxy_race import main

if __name__ == "__main__":
    main()
