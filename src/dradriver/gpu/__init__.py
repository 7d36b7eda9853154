"""GPU layer: the NVML port, its NVML adapter and simulator, and discovery into our device model."""
