"""`python -m bertkit.cli`: the same as the installed `bertkit` command."""

import sys

from bertkit.cli import main

sys.exit(main())
