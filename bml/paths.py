"""Where things live, for every layer: the repository and its compiled pipeline, and the run
directory where bml-net keeps each emulation's state and the control plane its fabric."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
P4SRC_DIR = REPO_ROOT / "p4src"
BUILD_DIR = P4SRC_DIR / "build"  # what p4c made of p4src, with the sources' hash
RUN_ROOT = Path(os.environ.get("BML_RUN_ROOT", "/tmp/bml-net"))  # one directory per emulation
DEFAULT_EMULATION = "bml"  # bml-net's name when none is given
DEFAULT_FABRIC = Path(os.environ.get("BML_FABRIC",
                                     str(RUN_ROOT / DEFAULT_EMULATION / "fabric.json")))
