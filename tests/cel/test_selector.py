import pytest

from dradriver.cel import CelCompileError, CelEvaluationError, compile_selector

DRIVER = "gpu.dradriver.dev"


def test_compiled_selectors_are_cached_per_expression():
    assert compile_selector('device.driver == "a"') is compile_selector('device.driver == "a"')


def test_compile_error_carries_line_column_and_hint():
    with pytest.raises(CelCompileError) as info:
        compile_selector('device.driver == "x" &&\n  device.capacity["gpu.dradriver.dev"].memory > 10')
    err = info.value
    assert err.line == 2
    assert "compareTo" in (err.hint or "")


def test_syntax_error_suggests_double_equals():
    with pytest.raises(CelCompileError) as info:
        compile_selector('device.driver = "x"')
    assert "==" in (info.value.hint or "")


def test_missing_attribute_error_names_the_attribute(gpu):
    selector = compile_selector('device.attributes["gpu.dradriver.dev"].model == "x"')
    with pytest.raises(CelEvaluationError) as info:
        selector.matches(gpu, driver=DRIVER)
    assert info.value.missing_attribute == "gpu.dradriver.dev/model"


def test_qualified_attribute_names_in_the_drivers_domain_are_found(gpu):
    gpu["attributes"]["gpu.dradriver.dev/extra"] = {"int": 5}
    assert compile_selector('device.attributes["gpu.dradriver.dev"].extra == 5').matches(gpu, driver=DRIVER)


def test_unqualified_names_belong_to_the_slices_driver(gpu):
    selector = compile_selector('device.attributes["other.example.com"].type == "gpu"')
    assert selector.matches(gpu, driver="other.example.com")


def test_selector_is_evaluated_once_per_distinct_projection(gpu):
    selector = compile_selector('device.attributes["gpu.dradriver.dev"].architecture == "Ampere" && true')
    before = selector.evaluations
    for i in range(50):
        device = {
            **gpu,
            "name": f"gpu-{i}",
            "attributes": {**gpu["attributes"], "uuid": {"string": f"GPU-{i}"}},
        }
        assert selector.matches(device, driver=DRIVER)
    assert selector.evaluations - before == 1


def test_memo_distinguishes_values_it_reads(gpu):
    selector = compile_selector('device.attributes["gpu.dradriver.dev"].productName.endsWith("80GB")')
    other = {**gpu, "attributes": {**gpu["attributes"], "productName": {"string": "NVIDIA A100-SXM4-40GB"}}}
    assert selector.matches(gpu, driver=DRIVER)
    assert not selector.matches(other, driver=DRIVER)


def test_memoised_errors_are_raised_again(gpu):
    selector = compile_selector('device.attributes["gpu.dradriver.dev"].nope == 1')
    for _ in range(2):
        with pytest.raises(CelEvaluationError, match="no such key: nope"):
            selector.matches(gpu, driver=DRIVER)


def test_whole_domain_reads_are_memoised_on_the_domain(gpu):
    selector = compile_selector('device.attributes["gpu.dradriver.dev"].exists(k, k == "uuid")')
    assert selector.reads == (("attribute-domain", "gpu.dradriver.dev"),)
    assert selector.matches(gpu, driver=DRIVER)


def test_invalid_version_attribute_is_a_runtime_error(gpu):
    gpu["attributes"]["driverVersion"] = {"version": "580.65"}
    with pytest.raises(CelEvaluationError, match=r"attribute driverVersion: parse semantic version: '580\.65'"):
        compile_selector('device.attributes["gpu.dradriver.dev"].type == "gpu"').matches(
            gpu, driver=DRIVER, memoize=False
        )


def test_comprehension_cost_is_estimated_at_compile_time():
    nested = "[" + ",".join(["1"] * 100) + "]"
    expression = f"{nested}.all(a, {nested}.all(b, {nested}.all(c, a + b + c > 0)))"
    with pytest.raises(CelCompileError, match="cost"):
        compile_selector(expression)


def test_overlong_expression_is_rejected():
    with pytest.raises(CelCompileError, match="characters"):
        compile_selector("true && " * 2000 + "true")


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes.?["gpu.dradriver.dev"].hasValue()',  # cel-go: '.?' takes a field name; use [?k]
        "device.driver.?size() == 3",  # cel-go: a method call cannot be optional
    ],
)
def test_optional_selection_without_a_field_name_is_a_syntax_error(expression):
    with pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    assert info.value.line == 1
    assert "syntax error" in str(info.value)


@pytest.mark.parametrize("expression", ["device < 1", "device in [1]", "[device] == [1]"])
def test_the_device_object_as_an_operand_is_a_compile_error_not_a_crash(expression):
    with pytest.raises(CelCompileError, match="no matching overload"):
        compile_selector(expression)


def test_the_device_equals_itself(gpu):
    assert compile_selector("device == device").matches(gpu, driver=DRIVER)
