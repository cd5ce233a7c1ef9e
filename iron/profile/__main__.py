"""``python -m iron.profile diff A B``: what moved between two profiles."""

import sys

from iron.tuning.diff import main

sys.exit(main())
