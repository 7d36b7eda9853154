"""Product facts: one table read by the NVML adapter, slice building, health and the simulator alike."""

from dradriver.gpu.products import (
    ARCHITECTURE_NAMES,
    ARCHITECTURE_NUMBERS,
    COMPUTE_SLICES_PER_GPU,
    MEMORY_SLICES_PER_GPU,
    load_products,
)
from dradriver.sim.fakelib import simulated_gpulib
from dradriver.sim.profiles import builtin_profile_names, load_node_profile


def test_every_known_product_has_an_architecture_nvml_can_name() -> None:
    for name, product in load_products().items():
        assert ARCHITECTURE_NAMES[ARCHITECTURE_NUMBERS[product.architecture]] == product.architecture, name


def test_every_mig_profile_fits_the_gpu_geometry() -> None:
    for product in load_products().values():
        for profile in product.mig_profiles:
            assert profile.slices <= COMPUTE_SLICES_PER_GPU
            assert all(start + profile.memory_slices <= MEMORY_SLICES_PER_GPU for start in profile.starts)


def test_the_adapter_reads_back_the_architecture_the_simulator_was_built_from() -> None:
    products = load_products()
    for profile_name in builtin_profile_names():
        profile = load_node_profile(profile_name)
        gpulib, _ = simulated_gpulib(profile_name, node_name="n")
        try:
            architectures = [gpu.architecture for gpu in gpulib.gpus()]
        finally:
            gpulib.close()
        assert architectures == [products[gpu.product].architecture for gpu in profile.gpus], profile_name
