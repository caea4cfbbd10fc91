"""gpu_worker."""
