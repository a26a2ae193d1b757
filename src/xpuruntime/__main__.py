"""`python -m xpuruntime ...`: the same command line as the `xpuruntime` script."""

import sys

from xpuruntime.cli import main

if __name__ == "__main__":
    sys.exit(main())
