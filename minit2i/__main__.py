"""`python -m minit2i`: the command line, as the installed `minit2i` script runs it."""

import sys

from minit2i.cli import main

sys.exit(main())
