"""The NVIDIA GPU driver: slices, prepare/unprepare, config, CDI and checkpoint, on the plugin layer."""
