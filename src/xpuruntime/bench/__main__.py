"""`python -m xpuruntime.bench`: the same as `xpuruntime bench`."""

import sys

from .cli import main

sys.exit(main())
