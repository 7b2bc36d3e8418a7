"""`python -m specdec.cli ...`: the `specdec` command without its console script."""

import sys

from specdec.cli.main import main

if __name__ == "__main__":  # importing the module (the import test does) runs nothing
    sys.exit(main())
