"""`python -m loadtest.seeded_sampling`, as the docs type it: the tool lives in `loadtest.correctness.seeded_sampling`."""

import sys

from loadtest.correctness.seeded_sampling import main

if __name__ == "__main__":
    sys.exit(main())
