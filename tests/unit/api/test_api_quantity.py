"""The one quantity parser (patchbay_api.quantity) against the API server's own answers.

GO_QUANTITIES and GO_REFUSED are what k8s.io/apimachinery v0.37.1 (the code the API server runs)
says of each input: ``resource.ParseQuantity``, then ``String()`` (the canonical form the API
server stores and returns), ``Value()`` and ``MilliValue()``; printed by
hack/apimachinery-cases (``go run . < cases.json``). Left out: the cases where Go's int64
arithmetic overflows (``1Ei`` in millis, ``9223372036854775808``), where this parser clamps.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patchbay_api.quantity import Quantity, QuantityError, parse_quantity, quantity_value

# (input, canonical form, Value(), MilliValue()) as apimachinery gives them
GO_QUANTITIES = [
    ("0", "0", 0, 0),
    ("1", "1", 1, 1000),
    ("4", "4", 4, 4000),
    ("-4", "-4", -4, -4000),
    ("+4", "+4", 4, 4000),
    ("1000m", "1", 1, 1000),
    ("1500m", "1500m", 2, 1500),
    ("1001m", "1001m", 2, 1001),
    ("100m", "100m", 1, 100),
    ("1m", "1m", 1, 1),
    ("1n", "1n", 1, 1),
    ("1u", "1u", 1, 1),
    ("0.1", "100m", 1, 100),
    ("0.5", "500m", 1, 500),
    ("1.5", "1500m", 2, 1500),
    ("2.000", "2", 2, 2000),
    ("1.", "1.", 1, 1000),
    (".5", "500m", 1, 500),
    ("1k", "1k", 1000, 1000000),
    ("2k", "2k", 2000, 2000000),
    ("1M", "1M", 1000000, 1000000000),
    ("1G", "1G", 1000000000, 1000000000000),
    ("1T", "1T", 1000000000000, 1000000000000000),
    ("1P", "1P", 1000000000000000, 1000000000000000000),
    ("1Ki", "1Ki", 1024, 1024000),
    ("1Mi", "1Mi", 1048576, 1048576000),
    ("1Gi", "1Gi", 1073741824, 1073741824000),
    ("1Ti", "1Ti", 1099511627776, 1099511627776000),
    ("1Pi", "1Pi", 1125899906842624, 1125899906842624000),
    ("1.5Ki", "1536", 1536, 1536000),
    ("1.5Gi", "1536Mi", 1610612736, 1610612736000),
    ("0.5Ki", "512", 512, 512000),
    ("1536Mi", "1536Mi", 1610612736, 1610612736000),
    ("1024Ki", "1Mi", 1048576, 1048576000),
    ("1e3", "1e3", 1000, 1000000),
    ("1E3", "1E3", 1000, 1000000),
    ("1e-3", "1e-3", 1, 1),
    ("1e+3", "1e+3", 1000, 1000000),
    ("12e-1", "1200e-3", 2, 1200),
    ("1.5e3", "1500", 1500, 1500000),
    ("100e-2", "1", 1, 1000),
    ("0.0000000001", "1n", 1, 1),
    ("1.0000000001", "1000000001n", 2, 1001),
    ("-1.5", "-1500m", -2, -1500),
    ("-1500m", "-1500m", -2, -1500),
    ("-0.1", "-100m", -1, -100),
    ("007", "007", 7, 7000),
    ("-", "0", 0, 0),
    ("+", "0", 0, 0),
    (".", "0", 0, 0),
]
# Values whose milli form overflows Go's int64 (so only Value() is compared).
GO_VALUES = [
    ("1E", 10**18),
    ("2E", 2 * 10**18),
    ("1Ei", 2**60),
    ("1e18", 10**18),
    ("9223372036854775807", 2**63 - 1),
    # binary quantities are capped at 2^63-1 by the parser itself
    ("8Ei", 2**63 - 1),
    ("16Ei", 2**63 - 1),
    ("9.5Ei", 2**63 - 1),
]
GO_REFUSED = [
    "", " 1", "1 ", "1K", "1k ", "1kk", "1e", "1E+", "1ee3", "1Kib", "abc", "1.2.3", "--1",
    "1e3.5", "1i", "1Mb", "0x10", "1_000", "1e1e1", "5Gi5",
]  # fmt: skip


@pytest.mark.parametrize(("text", "canonical", "value", "milli"), GO_QUANTITIES)
def test_every_form_reads_as_the_api_server_reads_it(
    text: str, canonical: str, value: int, milli: int
) -> None:
    q = parse_quantity(text)
    assert (q.value(), q.milli_value()) == (value, milli)
    # The form the API server stores and returns means the same.
    stored = parse_quantity(canonical)
    assert (stored.value(), stored.milli_value(), quantity_value(canonical)) == (value, milli, value)


@pytest.mark.parametrize(("text", "value"), GO_VALUES)
def test_large_values_and_the_binary_cap(text: str, value: int) -> None:
    assert quantity_value(text) == value


@pytest.mark.parametrize("text", GO_REFUSED)
def test_what_the_api_server_refuses_is_refused(text: str) -> None:
    with pytest.raises(QuantityError, match="quantit"):
        parse_quantity(text)


def test_values_are_exact_and_beyond_int64_clamped() -> None:
    assert parse_quantity("1.5Gi") == Quantity(1610612736, 0)
    assert parse_quantity("0.5") == Quantity(5, -1)
    assert parse_quantity("16Ei") == parse_quantity("9223372036854775807")  # the binary cap
    assert parse_quantity("1k") == parse_quantity("1000") == parse_quantity("1e3") == Quantity(1, 3)
    assert parse_quantity("123456789012345678901234567890").value() == 2**63 - 1
    assert parse_quantity("-123456789012345678901234567890").value() == -(2**63)
    # Huge exponents are not computed digit by digit.
    assert parse_quantity("1e999999999").value() == 2**63 - 1
    assert parse_quantity("1e-999999999").value() == 1
    assert parse_quantity("1e-999999999") == Quantity(1, -9)


@given(st.text(alphabet="0123456789.+-eEinumkKMGTP ", max_size=12))
def test_any_text_is_a_quantity_or_a_quantity_error(text: str) -> None:
    """Nothing but QuantityError escapes, whatever the text (a node's status is not ours), and
    what parses has values in int64's range."""
    try:
        q = parse_quantity(text)
    except QuantityError:
        return
    assert all(-(2**63) <= v < 2**63 for v in (q.value(), q.milli_value()))


@given(
    st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi", "e3", "m"])
)
def test_an_integer_with_a_suffix_is_that_integer_times_the_suffix(n: int, suffix: str) -> None:
    factor = {"": 1, "k": 10**3, "M": 10**6, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "e3": 10**3}
    want = -(-n // 1000) if suffix == "m" else min(n * factor[suffix], 2**63 - 1)
    assert quantity_value(f"{n}{suffix}") == want
