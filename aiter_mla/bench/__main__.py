"""``python -m aiter_mla.bench [flags]`` = ``aiter-mla bench [flags]``."""
import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
