"""``python -m iron.profile diff A B``: what moved between two profiles."""

import sys

from iron.profile.diff import main

sys.exit(main())
