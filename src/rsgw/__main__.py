"""`python -m rsgw` is the `rsgw` command."""

import sys

from rsgw._cli import main

sys.exit(main())
