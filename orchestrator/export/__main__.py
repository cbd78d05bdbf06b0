import sys

from orchestrator.export.cli import main

sys.exit(main())
