"""`python -m loadtest.k0_equivalence`, as the README types it: the tool lives in `loadtest.correctness.k0_equivalence`."""

from loadtest.correctness.k0_equivalence import main

if __name__ == "__main__":
    main()
