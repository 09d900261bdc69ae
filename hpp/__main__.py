"""``python -m hpp``: the ``hpp`` command line (:func:`hpp.cli.main`), for environments without the console script."""

import sys

from hpp.cli import main

if __name__ == "__main__":
    sys.exit(main())
