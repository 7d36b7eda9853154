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


def test_a_product_entry_is_checked_field_by_field() -> None:
    from dradriver.gpu.products import ProductSpec

    good = {"architecture": "Hopper", "computeCapability": "9.0", "memoryMiB": 81559, "multiprocessors": 132,
            "pciDeviceId": 0x2330, "nvlinks": 18}  # fmt: skip
    assert ProductSpec.read(good, "H100").mig_profiles == ()
    for change, message in [
        ({"computeCapability": "9"}, "H100.computeCapability: String should match pattern"),
        ({"nvlinks": 40}, "H100.nvlinks: Input should be less than or equal to 36"),
        ({"colour": "green"}, "H100.colour: Extra inputs are not permitted"),
        ({"migProfiles": [{"name": "1g"}]}, "H100.migProfiles.0.id: Field required"),
    ]:
        try:
            ProductSpec.read({**good, **change}, "H100")
        except ValueError as err:
            assert str(err).startswith(message), err
        else:
            raise AssertionError(f"{change} was accepted")
