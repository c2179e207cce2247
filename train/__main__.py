"""``python -m train``: the same as ``bml-train`` (the launcher runs each rank this way)."""

import sys

from train.cli import main

sys.exit(main())
