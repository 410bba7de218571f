"""Ray capacity helpers: reclaim capacity that co-tenants of a Ray cluster released.

* :func:`wait_for_stable_ray_resources` polls the available resources until the ones a
  reserve actor needs stay free across several observations, and returns that snapshot.
* :func:`run_with_ray_reserve_topup` runs a primary slice of work at once and, as soon as
  such capacity is stable, a reserve slice sized from the snapshot, concurrently.

Ray is an optional extra (``dagster-slurm[ray]``): importing this package does not import
Ray; only the default resource provider does, when it is first called.
"""

from dagster_slurm.ray.capacity import (
    ProviderRetry,
    RayResourcesUnavailable,
    ResourceProvider,
    default_retryable_errors,
    ray_available_resources,
    wait_for_stable_ray_resources,
)
from dagster_slurm.ray.topup import run_with_ray_reserve_topup

__all__ = [
    "ProviderRetry",
    "RayResourcesUnavailable",
    "ResourceProvider",
    "default_retryable_errors",
    "ray_available_resources",
    "run_with_ray_reserve_topup",
    "wait_for_stable_ray_resources",
]
