"""``python -m patchbay_kubectl``: the same as ``kubectl patchbay``."""

import sys

from patchbay_kubectl.cli import main

sys.exit(main())
