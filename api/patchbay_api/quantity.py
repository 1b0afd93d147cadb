"""Kubernetes quantities (``resource.Quantity``): the one parser every Patchbay program uses.

A node's capacity and allocatable, a pod's requests and limits are quantity strings:
``<sign><digits>[.<digits>]<suffix>``, the suffix a decimal SI one (``n u m "" k M G T P E``), a
binary SI one (``Ki Mi Gi Ti Pi Ei``) or a decimal exponent (``e3``, ``E-2``; a bare ``E`` is exa).
``parse_quantity`` follows apimachinery's ``ParseQuantity`` step by step (the same grammar, the
same refusals, a value below one nano rounded up to it, a binary quantity capped at 2^63-1), and
``value`` is ``Quantity.Value()``: the value rounded UP (away from zero) to an integer, which is
what the scheduler counts of an extended resource. Exact integer arithmetic throughout (no
floats, no ``decimal`` context that could round a long mantissa).
"""

from __future__ import annotations

from dataclasses import dataclass

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_MAX_INT64 = 2**63 - 1
_MIN_INT64 = -(2**63)
#: 10**20 is beyond int64: a larger shift of a non-zero value is clamped without computing it.
_MAX_SHIFT = 20
_NANO = -9


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message quotes it and says why, in the API server's words."""


@dataclass(frozen=True)
class Quantity:
    """An exact quantity: ``unscaled * 10**scale`` (scale at least -9, as the API keeps it), with
    no trailing zero in ``unscaled`` (``1k`` and ``1000`` are one value, one form)."""

    unscaled: int
    scale: int

    def scaled_value(self, scale: int) -> int:
        """``q / 10**scale`` rounded away from zero, as ``Quantity.ScaledValue`` (0: ``Value()``,
        -3: ``MilliValue()``; ``-1.5`` is -2, as the API server counts it);
        beyond int64 it is clamped to int64's range (where Go's would overflow; the API server
        never stores such a node value)."""
        shift, u = self.scale - scale, self.unscaled
        if shift > _MAX_SHIFT and u:
            return _MAX_INT64 if u > 0 else _MIN_INT64
        if shift >= 0:
            return max(_MIN_INT64, min(_MAX_INT64, u * _pow10(shift)))
        magnitude = _ceil_div_pow10(abs(u), -shift)
        return max(_MIN_INT64, min(_MAX_INT64, magnitude if u >= 0 else -magnitude))

    def value(self) -> int:
        """The value rounded up to an integer (``Quantity.Value()``)."""
        return self.scaled_value(0)

    def milli_value(self) -> int:
        """The value in thousandths, rounded up (``Quantity.MilliValue()``)."""
        return self.scaled_value(-3)


def _pow10(n: int) -> int:
    return int(10**n)


def _pow2(n: int) -> int:
    return int(2**n)


def _ceil_div_pow10(u: int, places: int) -> int:
    """``ceil(u / _pow10(places))`` for ``u >= 0``, without computing a power that cannot matter: once
    ``places`` exceeds ``u``'s digits the result is 1 (u > 0) or 0."""
    if places > len(str(u)):
        return 1 if u > 0 else 0
    return -((-u) // _pow10(places))


def _split(text: str) -> tuple[bool, str, str, str]:
    """sign, numerator, denominator and suffix, as apimachinery's ``parseQuantityString``."""
    positive, pos, end = True, 0, len(text)
    if text[:1] in ("-", "+"):
        positive, pos = text[0] != "-", 1
    while pos < end and text[pos] == "0":
        pos += 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in ("-", "+"):
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(
            f"{text!r}: quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    return positive, num, denom, text[suffix_start:]


def _suffix(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a suffix, or None when it is none."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[2:] if suffix[1] in "+-" else suffix[1:]
        if digits and all(c in _DIGITS for c in digits):
            return 10, int(suffix[1:])
    return None


def parse_quantity(text: str) -> Quantity:
    """``text`` as the API server reads a quantity; QuantityError when it would refuse it."""
    if not isinstance(text, str) or not text:
        raise QuantityError(f"{text!r}: a quantity is a non-empty string")
    positive, num, denom, suffix = _split(text)
    base_exponent = _suffix(suffix)
    if base_exponent is None:
        raise QuantityError(f"{text!r}: unable to parse quantity's suffix")
    base, exponent = base_exponent
    unscaled, scale = int(num + denom), -len(denom)
    if base == 10:
        scale += exponent
    else:
        unscaled *= _pow2(exponent)
    if scale < _NANO and unscaled:
        # Below one nano: rounded up (away from zero; unscaled is not negative yet) to whole
        # nanos, as the API server does.
        unscaled, scale = _ceil_div_pow10(unscaled, _NANO - scale), _NANO
    if base == 2 and unscaled > _MAX_INT64 * _pow10(max(-scale, 0)):
        unscaled, scale = _MAX_INT64, 0  # the API server's cap for binary quantities
    if not unscaled:
        scale = 0
    while unscaled and unscaled % 10 == 0:  # one form per value, so equal quantities compare equal
        unscaled, scale = unscaled // 10, scale + 1
    return Quantity(unscaled if positive else -unscaled, scale)


def quantity_value(text: str) -> int:
    """The integer the scheduler counts of ``text`` (``Quantity.Value()``: rounded up)."""
    return parse_quantity(text).value()
