"""Conformance table: expressions with the result (or error) the Kubernetes scheduler's CEL gives.

Written from the CEL language definition, cel-go's behaviour, and the Kubernetes CEL library and DRA
documentation. ``COMPILE`` means a compile (type-check) error, ``ERROR`` a runtime error for this device.
"""

import pytest

from dradriver.cel import CelCompileError, CelEvaluationError, compile_selector

DRIVER = "gpu.dradriver.dev"
COMPILE, ERROR = "compile", "error"
A = 'device.attributes["gpu.dradriver.dev"]'
C = 'device.capacity["gpu.dradriver.dev"]'
K = 'device.attributes["resource.kubernetes.io"]'
REPLACE = '.replace("", "' + "x" * 60 + '")'

CASES = [
    # the device variable
    ('device.driver == "gpu.dradriver.dev"', True),
    ('device.driver != "gpu.dradriver.dev"', False),
    (f'{A}.type == "gpu"', True),
    (f'{A}.productName == "NVIDIA A100-SXM4-80GB"', True),
    (f'{A}.productName == "NVIDIA A100-SXM4-40GB"', False),
    (f'{A}["productName"] == "NVIDIA A100-SXM4-80GB"', True),
    (f"{K}.numaNode == 1", True),
    (f'{K}.pcieRoot == "pci0000:00"', True),
    (f"{A}.migCapable", True),
    (f"{A}.migCapable == true", True),
    (f"!{A}.migCapable", False),
    ("device.allowMultipleAllocations == false", True),
    ('device.name == "x"', COMPILE),
    ('devices.driver == "x"', COMPILE),
    # missing attributes and domains: runtime errors, unless guarded
    (f'{A}.noSuchAttribute == "x"', ERROR),
    ('device.attributes["nvidia.com"].model == "x"', ERROR),
    (f'"noSuchAttribute" in {A} && {A}.noSuchAttribute == "x"', False),
    (f'has({A}.noSuchAttribute) && {A}.noSuchAttribute == "x"', False),
    (f"has({A}.productName)", True),
    ('"nvidia.com" in device.attributes', False),
    ('"gpu.dradriver.dev" in device.attributes', True),
    ('device.attributes["nvidia.com"].size() == 0', True),
    (f"{A}.size() == 8", True),
    (f'{C}.noSuchCapacity.compareTo(quantity("1")) > 0', ERROR),
    # && and || absorb errors when the other side decides
    (f'false && {A}.missing == "x"', False),
    (f'{A}.missing == "x" && false', False),
    (f'true || {A}.missing == "x"', True),
    (f'{A}.missing == "x" || true', True),
    (f'true && {A}.missing == "x"', ERROR),
    (f'false || {A}.missing == "x"', ERROR),
    (f'{A}.missing == "x" || {A}.other == "y"', ERROR),
    (f'({A}.missing == "x") ? true : false', ERROR),
    (f"false ? {A}.missing : true", True),
    # result must be a bool
    ("1", COMPILE),
    ('"true"', COMPILE),
    (f"{A}.productName", ERROR),
    (f"{A}.numaNode", ERROR),
    ("true", True),
    ("false", False),
    # versions are semver values, not strings
    (f'{A}.driverVersion == "580.65.6"', ERROR),
    (f'{A}.driverVersion == semver("580.65.6")', True),
    (f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))', True),
    (f'{A}.driverVersion.isLessThan(semver("550.0.0"))', False),
    (f'{A}.driverVersion.compareTo(semver("580.65.6")) == 0', True),
    (f'{A}.driverVersion.compareTo(semver("600.0.0")) == -1', True),
    (f"{A}.driverVersion.major() == 580", True),
    (f"{A}.driverVersion.minor() == 65 && {A}.driverVersion.patch() == 6", True),
    (f'{A}.driverVersion > semver("1.0.0")', COMPILE),
    (f'{A}.cudaComputeCapability.isGreaterThan(semver("7.5.0"))', True),
    ('semver("1.2.3").isLessThan(semver("1.10.0"))', True),
    ('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),
    ('semver("1.0.0-alpha.1").compareTo(semver("1.0.0-alpha.beta")) == -1', True),
    ('semver("1.0.0+build1") == semver("1.0.0+build2")', True),
    ('isSemver("1.2.3")', True),
    ('isSemver("v1.2.3")', False),
    ('isSemver("v1.2", true)', True),
    ('isSemver("01.2.3")', False),
    ('semver("01.02.03", true).major() == 1', True),
    ('semver("not-a-version").major() == 1', ERROR),
    ('semver("1.2.3") > semver("1.0.0")', COMPILE),
    ('semver("1.2.3").compareTo("1.0.0") > 0', COMPILE),
    # quantities
    (f'{C}.memory.compareTo(quantity("80Gi")) == 0', True),
    (f'{C}.memory.compareTo(quantity("40Gi")) > 0', True),
    (f'{C}.memory.isGreaterThan(quantity("79Gi"))', True),
    (f'{C}.memory.isLessThan(quantity("1Ti"))', True),
    (f"{C}.memory > 10", COMPILE),
    (f'{C}.memory == quantity("80Gi")', True),
    (f'{C}.memory == quantity("85899345920")', True),
    (f"{C}.memory.asInteger() == 85899345920", True),
    (f"{C}.multiprocessors.asInteger() >= 100", True),
    (f'{C}.memory.compareTo("80Gi") == 0', COMPILE),
    ('quantity("1.5Gi").isInteger()', True),
    ('quantity("500m").isInteger()', False),
    ('quantity("500m").asInteger() == 0', ERROR),
    ('quantity("500m").asApproximateFloat() == 0.5', True),
    ('quantity("1e400").asApproximateFloat() > 1.0e308', True),
    ('quantity("-1e400").asApproximateFloat() < -1.0e308', True),
    ('quantity("1k") == quantity("1000")', True),
    ('quantity("1Ki") == quantity("1024")', True),
    ('quantity("1e3") == quantity("1k")', True),
    ('quantity("-1").sign() == -1 && quantity("0").sign() == 0', True),
    ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
    ('quantity("1Gi").sub(1073741823) == quantity("1")', True),
    ('quantity("2x")  == quantity("2")', ERROR),
    ('isQuantity("2x")', False),
    ('isQuantity("100Mi")', True),
    ('quantity("1") + quantity("1") == quantity("2")', COMPILE),
    # strings: standard functions and the strings extension
    (f'{A}.productName.startsWith("NVIDIA A100")', True),
    (f'{A}.productName.endsWith("80GB")', True),
    (f'{A}.productName.contains("SXM4")', True),
    (f'{A}.productName.matches("^NVIDIA A100-SXM4-(40|80)GB$")', True),
    (f'{A}.productName.lowerAscii() == "nvidia a100-sxm4-80gb"', True),
    (f'{A}.productName.upperAscii().contains("NVIDIA")', True),
    (f'{A}.productName.split(" ")[1] == "A100-SXM4-80GB"', True),
    (f'{A}.productName.split("-").size() == 3', True),
    ('"a-b-c".split("-", 2) == ["a", "b-c"]', True),
    ('["a", "b"].join(",") == "a,b"', True),
    ('["a", "b"].join() == "ab"', True),
    ('"hello".substring(1, 3) == "el"', True),
    ('"hello".substring(4, 10) == "o"', ERROR),
    ('"hello".indexOf("l") == 2 && "hello".lastIndexOf("l") == 3', True),
    ('"hello".indexOf("z") == -1', True),
    ('"hello".charAt(1) == "e"', True),
    ('"a.b.c".replace(".", "-") == "a-b-c"', True),
    ('"a.b.c".replace(".", "-", 1) == "a-b.c"', True),
    ('"  x ".trim() == "x"', True),
    ('"\\t\\u00a0\\u3000x\\n".trim() == "x"', True),
    ('"\\x1fx".trim() == "\\x1fx"', True),
    ('"abc".reverse() == "cba"', COMPILE),  # string reverse() is strings v3; Kubernetes enables v2
    ('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""', True),
    ('size("abc") == 3 && "abc".size() == 3', True),
    ('"abc"[0] == "a"', COMPILE),
    ('"abc" + "def" == "abcdef"', True),
    ('"x".matches("[")', COMPILE),  # a constant regex that does not compile (ValidateRegexLiterals)
    ('"x".matches(dyn("["))', ERROR),
    # regex library
    ('"GPU-1234-abcd".find("[0-9]+") == "1234"', True),
    ('"a1b22c333".findAll("[0-9]+") == ["1", "22", "333"]', True),
    ('"a1b22c333".findAll("[0-9]+", 2) == ["1", "22"]', True),
    ('"abc".find("[0-9]+") == ""', True),
    # lists library and macros
    ("[1, 2, 3].isSorted() && ![3, 1].isSorted()", True),
    ("[1, 2, 3].sum() == 6", True),
    ("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3", True),
    ("[1, 2, 3].indexOf(2) == 1 && [1, 2, 2].lastIndexOf(2) == 2", True),
    ("[].min() == 0", ERROR),
    ("[1, 2, 3].exists(x, x > 2)", True),
    ("[1, 2, 3].all(x, x > 0)", True),
    ("[1, 2, 3].exists_one(x, x > 1)", False),
    ("[1, 2, 3].filter(x, x > 1) == [2, 3]", True),
    ("[1, 2, 3].map(x, x * 2) == [2, 4, 6]", True),
    ("[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]", True),
    ("[0, 1].exists(x, 10 / x == 10)", True),
    ("[1, 0].exists(x, 10 / x == 10)", True),
    ("[0].exists(x, 10 / x == 10)", ERROR),
    ("[0, 1].all(x, 10 / x == 1)", False),
    ("[1].all(x, 10 / x == 10)", True),
    (f'{A}.exists(k, k == "productName")', True),
    (f'{A}.productName in ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]', True),
    ('cel.bind(a, device.attributes["gpu.dradriver.dev"], a.type == "gpu" && a.migCapable)', True),
    ("sets.contains([1, 2, 3], [2, 3]) && !sets.contains([1], [2])", True),
    ("sets.intersects([1, 2], [2, 5]) && sets.equivalent([1, 2], [2, 1])", True),
    ("[1, 2].exists(x, x)", COMPILE),
    ("1.exists(x, x > 0)", COMPILE),
    # arithmetic, equality and types
    ("1 + 2 == 3", True),
    ("7 / 2 == 3 && -7 / 2 == -3 && -7 % 2 == -1", True),
    ("1 / 0 == 1", ERROR),
    ("5 % 0 == 1", ERROR),
    ("9223372036854775807 + 1 > 0", ERROR),
    ("-9223372036854775808 - 1 < 0", ERROR),
    ("-9223372036854775808 % -1 == 0", ERROR),
    ("-9223372036854775808 / -1 == 0", ERROR),
    ("int(-9223372036854775808.0) < 0", ERROR),
    ("int(-9223372036854774784.0) < 0", True),
    ("2u + 3u == 5u", True),
    ("1u - 2u == 0u", ERROR),
    ("1.5 + 1.5 == 3.0", True),
    ("1 + 1.0 == 2.0", COMPILE),
    ("1 == 1.0", COMPILE),
    ("dyn(1) == 1.0", True),
    ("dyn(1) == 1u", True),
    ('dyn(1) == "1"', False),
    ("1 < 2.5", True),
    ('1 < "a"', COMPILE),
    ('int("42") == 42 && string(42) == "42"', True),
    ('int("x") == 1', ERROR),
    # Go's strconv: no blanks, no digit underscores, no "u" suffix
    ('int("+42") == 42 && int("-42") == -42 && uint("42") == 42u', True),
    ('int(" 42") == 42', ERROR),
    ('int("1_000") == 1000', ERROR),
    ('uint("1u") == 1u', ERROR),
    ('double(" 1.5") == 1.5', ERROR),
    ('double("1_0.5") == 10.5', ERROR),
    ('double("1e3") == 1000.0 && double("-Inf") < 0.0 && double(".5") == 0.5', True),
    # string(double) is Go's %g (cel-go), shortest digits, exponent from 1e+06 on
    ('string(1.5) == "1.5" && string(100.0) == "100" && string(-0.5) == "-0.5"', True),
    ('string(1000000.0) == "1e+06" && string(123456.0) == "123456"', True),
    ('string(1234567.5) == "1.2345675e+06" && string(0.00001) == "1e-05"', True),
    ('string(0.0001) == "0.0001" && string(1e100) == "1e+100"', True),
    ('string(1.0/0.0) == "+Inf" && string(-1.0/0.0) == "-Inf" && string(0.0/0.0) == "NaN"', True),
    ('double("1.5") == 1.5 && uint(3) == 3u', True),
    ('bool("true") && !bool("false")', True),
    ('type(1) == int && type("a") == string && type(1u) == uint', True),
    (f"type({A}.numaNode) == int || true", True),
    ("[1, 2] == [1, 2] && [1] != [2]", True),
    ('{"a": 1}["a"] == 1 && {"a": 1}.a == 1', True),
    ('{"a": 1}["b"] == 1', ERROR),
    ('{"a": 1, "a": 2}.a == 1', ERROR),
    ("[1, 2][5] == 1", ERROR),
    ("null == null", True),
    ("true ? 1 : 2", COMPILE),
    ("(true ? 1 : 2) == 1", True),
    ("!1", COMPILE),
    ("1 && true", COMPILE),
    # optional types (cel-go's optional library; Kubernetes 1.28+)
    (f'{A}.?model.orValue("none") == "none"', True),
    (f"{A}.?productName.hasValue()", True),
    (f'{A}.?productName.value().startsWith("NVIDIA")', True),
    (f'{A}[?"productName"].orValue("") == "NVIDIA A100-SXM4-80GB"', True),
    (f"{A}.?model.value() == 1", ERROR),
    (f"{K}.?numaNode.orValue(0) == 1", True),
    # Kubernetes' device maps find every domain, so an unknown one is an empty map, not none
    ('device.attributes[?"nvidia.com"].hasValue()', True),
    ('device.attributes[?"nvidia.com"].?model.hasValue()', False),
    (f'optional.of({A}).productName.orValue("") != ""', True),
    ("optional.none().orValue(true)", True),
    ("optional.ofNonZeroValue(0).hasValue()", False),
    ("optional.of(1).or(optional.of(2)).value() == 1 && optional.none().or(optional.of(2)).value() == 2", True),
    ("[?optional.of(1), ?optional.none(), 3] == [1, 3]", True),
    ('{?"a": optional.none(), "b": 2}.size() == 1', True),
    ("optional.of(2).optMap(x, x * 2).value() == 4", True),
    ("[1, ?2] == [1, 2]", COMPILE),
    ("optional.of(1) == 1", COMPILE),
    # two-variable comprehensions (cel-go ext.TwoVarComprehensions; Kubernetes 1.32+)
    (f'{A}.exists(k, v, k == "productName" && v == "NVIDIA A100-SXM4-80GB")', True),
    ('["a", "b"].all(i, v, i == 0 && v == "a" || i == 1 && v == "b")', True),
    ("[1, 2, 3].existsOne(i, v, v > i + 1)", False),
    ("[10, 20].transformList(i, v, i + v) == [10, 21]", True),
    ("[10, 20, 30].transformList(i, v, i > 0, v) == [20, 30]", True),
    ('{"a": 1, "b": 2}.transformMap(k, v, v * 10) == {"a": 10, "b": 20}', True),
    ('{"a": 1}.transformMapEntry(k, v, {v: k}) == {1: "a"}', True),
    ('{"a": 1, "b": 1}.transformMapEntry(k, v, {v: k}).size() == 1', ERROR),
    ("[1, 2].exists(i, i, i > 0)", COMPILE),
    # heterogeneous equality as cel-go: the left operand's Equal decides
    (f'"580.65.6" == {A}.driverVersion', False),
    (f'dyn("80Gi") == {C}.memory', False),
    (f'{C}.memory == dyn("80Gi")', ERROR),
    (f'"80Gi" == {C}.memory', COMPILE),
    (f'{A}.driverVersion in ["580.65.6"]', False),
    (f'"580.65.6" in [{A}.driverVersion]', False),
    # cel-go's list equality treats an element error as "not unequal"
    (f'[{A}.driverVersion] == ["580.65.6"]', True),
    (f'["580.65.6"] == [{A}.driverVersion]', False),
    (f"{A}.driverVersion == null", False),
    ("dyn(1) == 1.0 && dyn(1u) == 1 && dyn(2.5) != 2", True),
    ('dyn(1) in [1.0] && !(dyn("1") in [1])', True),
    # compile-time checks the API server makes
    ('[1, "a"].size() == 2', COMPILE),
    ('[1, dyn("a")].size() == 2', COMPILE),  # cel-go compares literal element types exactly: dyn is not int
    ('[dyn(1), dyn("a")].size() == 2', True),
    ('"%s has %d GPUs".format(["node-a", 8]) == "node-a has 8 GPUs"', True),  # format() arguments may mix
    ('"%.2f".format([1.005]) == "1.00" && "%x".format(["hi"]) == "6869"', True),
    ('"%d".format([1.5]) == ""', ERROR),
    ('"%.999999999f".format([1.5]) == ""', ERROR),
    ('{"a": 1, "b": "x"}.size() == 2', COMPILE),
    ("[[1], [2.0]].size() == 2", COMPILE),
    ('"x".find("(")  == ""', COMPILE),
    ('"x".findAll("[a-", 1).size() == 0', COMPILE),
    ('"a".matches("^a$")', True),
    ('"ab"' + REPLACE * 6 + ' == ""', COMPILE),  # grows to ~10^11 characters: refused by the cost estimate
    ('"ab"' + REPLACE * 2 + ' != ""', True),
    (
        "[1,2,3,4,5,6,7,8,9,10].map(a, [1,2,3,4,5,6,7,8,9,10].map(b, [1,2,3,4,5,6,7,8,9,10].map(c, "
        "[1,2,3,4,5,6,7,8,9,10].map(d, [1,2,3,4,5,6,7,8,9,10].map(e, [1,2,3,4,5,6,7,8,9,10].map(f, "
        "'x'))))))).size() == 10",
        COMPILE,
    ),
    # lists extension v3 (Kubernetes 1.34+); string reverse() is strings v3, not enabled
    ("[3, 1, 2].sort() == [1, 2, 3] && [1, 2, 1].distinct() == [1, 2] && [1, 2].reverse() == [2, 1]", True),
    ("[1, [2, [3]]].flatten() == [1, 2, [3]] && [1, [2, [3]]].flatten(2) == [1, 2, 3]", COMPILE),
    ("[dyn(1), dyn([2, 3])].flatten().size() == 3 && [[1], [2, 3]].flatten() == [1, 2, 3]", True),
    ("[1, 2, 3, 4].slice(1, 3) == [2, 3] && lists.range(3) == [0, 1, 2]", True),
    ('["bb", "a"].sortBy(s, s.size()) == ["a", "bb"]', True),
    ("[1, 2].slice(2, 1) == []", ERROR),
    ("lists.range(2000000).size() > 0", ERROR),
    ("[true, false].sort() == [false, true]", True),
    # Kubernetes IP and CIDR libraries (1.30+)
    ('ip("10.0.0.1").family() == 4 && ip("::1").isLoopback() && isIP("fe80::1") && !isIP("fe80::1%eth0")', True),
    ('!isIP("::ffff:1.2.3.4") && !isIP("010.0.0.1") && ip.isCanonical("2001:db8::abcd")', True),
    ('!ip.isCanonical("2001:DB8::ABCD") && string(ip("2001:db8:0:0::abcd")) == "2001:db8::abcd"', True),
    ('ip("169.254.1.1").isLinkLocalUnicast() && ip("224.0.0.5").isLinkLocalMulticast()', True),
    ('ip("192.168.0.1").isGlobalUnicast() && !ip("255.255.255.255").isGlobalUnicast()', True),
    ('cidr("192.168.0.0/16").containsIP("192.168.3.4") && !cidr("192.168.0.0/16").containsIP(ip("10.0.0.1"))', True),
    ('cidr("192.168.0.0/16").containsCIDR("192.168.10.0/24")', True),
    ('cidr("192.168.1.0/24").containsCIDR(cidr("192.168.2.0/24"))', False),
    ('cidr("192.168.0.1/24").masked() == cidr("192.168.0.0/24") && cidr("10.0.0.0/8").prefixLength() == 8', True),
    ('string(cidr("192.168.0.129/24")) == "192.168.0.129/24" && cidr("10.1.2.3/8").ip() == ip("10.1.2.3")', True),
    (
        'isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0/024") && !isCIDR("10.0.0.0/255.0.0.0") && !isCIDR("10.0.0.0/33")',
        True,
    ),
    ('ip("10.0.0.1") == "10.0.0.1"', COMPILE),
    ('ip("10.0.0.1") == dyn("10.0.0.1")', ERROR),
    ('dyn("10.0.0.1") == ip("10.0.0.1")', False),
    ('ip("10.0.0.256").family() == 4', ERROR),
    (f"ip({K}.pcieRoot).family() == 4", ERROR),
    # DRA list-type attributes: includes()
    (f'{A}.productName.includes("NVIDIA A100-SXM4-80GB")', True),
    ('["a", "b"].includes("b") && ![1, 2].includes(3) && ![1].includes("1")', True),
    (f'[{A}.driverVersion].includes("580.65.6")', False),
    # syntax and unknown names
    ('device.driver = "x"', COMPILE),
    ("device.driver == ", COMPILE),
    ("noSuchFunction(1)", COMPILE),
    ('"a".noSuchMethod()', COMPILE),
    ('timestamp("2024-01-01T00:00:00Z") > timestamp("2023-01-01T00:00:00Z")', COMPILE),
    ("", COMPILE),
    ("x", COMPILE),
    ("Foo{a: 1}", COMPILE),
]


@pytest.mark.parametrize(("expression", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_expression_matches_the_scheduler(gpu, expression, expected):
    if expected == COMPILE:
        with pytest.raises(CelCompileError):
            compile_selector(expression)
        return
    selector = compile_selector(expression)
    if expected == ERROR:
        with pytest.raises(CelEvaluationError):
            selector.matches(gpu, driver=DRIVER)
        return
    assert selector.matches(gpu, driver=DRIVER) is expected


def test_the_table_is_large_enough():
    assert len(CASES) >= 100
