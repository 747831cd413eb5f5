"""``python -m instaslice``: the ``instaslice`` command."""

import sys

from instaslice.cli import main

sys.exit(main())
