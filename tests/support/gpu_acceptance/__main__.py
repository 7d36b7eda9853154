"""``python -m support.gpu_acceptance``: what scripts/gpu-acceptance runs."""

import sys

from support.gpu_acceptance.main import main

sys.exit(main())
