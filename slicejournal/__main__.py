"""`python -m slicejournal ...`: the `slicejournal` command, for a Python without the script."""

import sys

from slicejournal.cli import main

sys.exit(main())
