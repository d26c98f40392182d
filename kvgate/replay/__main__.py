"""``python -m kvgate.replay``: the same as ``kvgate replay``."""

import sys

from kvgate.replay.command import main_replay

sys.exit(main_replay())
