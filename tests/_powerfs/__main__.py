"""``python -m tests._powerfs BACKING MOUNTPOINT --model strict``: see ``fuse.py``."""

import sys

from .fuse import main

sys.exit(main())
