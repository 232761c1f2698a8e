"""`python -m proxy` runs the proxy with settings from the CLI, environment or TOML."""

from pdspec.cli import main

if __name__ == "__main__":
    main(["proxy", *__import__("sys").argv[1:]])
