"""``python -m vramtui``: the same as the ``vramtui`` command."""

import sys

from .cli import main

sys.exit(main())
