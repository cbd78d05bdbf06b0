import sys

from orchestrator.probe.cli import main

sys.exit(main())
