"""`python3 agent.pyz run [--stay]`: the zipapp's entry point (and `python -m node_agent`)."""

import sys

from node_agent.agent import main

sys.exit(main())
