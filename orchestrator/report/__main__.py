import sys

from orchestrator.report.cli import main

sys.exit(main())
