"""``python -m aiotier_bench``: the same as ``aiotier bench``."""

import sys

from .suite import main

sys.exit(main(prog="python -m aiotier_bench"))
