"""``python -m dagster_slurm.agent.remote``: run the agent from the installed package."""

import sys

from .protocol import main

sys.exit(main())
