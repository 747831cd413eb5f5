"""GPU backends: the ``GpuBackend`` seam, NVML for real GPUs, an emulation for everything else."""
