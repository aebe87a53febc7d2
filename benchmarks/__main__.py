"""``python -m benchmarks`` (from the repository root): see benchmarks/README.md."""

import sys

from benchmarks.run import main

sys.exit(main())
