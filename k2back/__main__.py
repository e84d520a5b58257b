"""`python -m k2back`: the `k2back` command line."""

import sys

from k2back.cli import main

sys.exit(main())
