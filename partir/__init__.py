"""partir: find SPMD partitioning plans for JAX programs."""
