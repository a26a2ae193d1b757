"""`python -m xpuruntime.bench`: run the benchmark suite."""

import sys

from . import main

sys.exit(main())
