"""``python -m aiotier``: the same as the ``aiotier`` command."""

import sys

from .cli import main

sys.exit(main())
