"""`python -m loadtest.proxy_bench`, as the README types it: the tool lives in `loadtest.micro.proxy_bench`."""

from loadtest.micro.proxy_bench import main

if __name__ == "__main__":
    main()
