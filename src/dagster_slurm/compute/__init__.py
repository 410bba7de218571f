"""``ComputeResource`` and the runners behind ``compute.run(...)`` (local and Slurm)."""
