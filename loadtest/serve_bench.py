"""`python -m loadtest.serve_bench`, as the README types it: the tool lives in `loadtest.serving.serve_bench`."""

from loadtest.serving.serve_bench import cli

if __name__ == "__main__":
    cli()
