"""The documented path of the simulated cluster (see rehearsal/simcluster.py)."""
from .rehearsal.simcluster import SimCluster  # noqa: F401
