"""The fields of a block of ``simctl-trace/1`` call lines, found in one pass over its bytes.

:func:`scan_call_lines` is plain Python that numba compiles: a build compiles it into the
kernel's extension (:mod:`simulator.model.extension`), where the native reader calls it
(:func:`simulator.trace.formats.native._split_lines`); without the extension the reader
finds the same fields with array operations over the whole block (several passes, each
with temporaries the size of the block: some five times slower). Nothing here imports
numba, so a process that reads a trace never loads it.

A line is accepted only when it is exactly as the writer writes a call::

    {"id": "ID", "t": NUMBER, "prompts": [...]},

(four spaces first; the file's last call without the comma) with an id of at most
:data:`SHORT_FIELD` bytes of printable ASCII without a backslash, and a time of at most as
many bytes before its comma. Anything else fails the block, which msgspec then decodes
whole: what is accepted here decodes to what msgspec gives.

The times are converted as they are read: a JSON number of at most 19 significant digits
whose value is a normal double (the writer's shortest round-trip form always is) becomes the
double nearest to it by the Eisel-Lemire algorithm (D. Lemire, "Number parsing at a gigabyte
per second", Software: Practice and Experience 51(8), 2021; the table of powers of five is
computed here as that paper's ``fast_float`` library computes it). A time it cannot decide
(more digits, a subnormal or infinite value, the algorithm's rare undecided case) fails the
block: msgspec converts it, correctly rounded too.
"""

from __future__ import annotations

import numpy as np

#: The longest id or time looked for (a longer one leaves the block to msgspec).
SHORT_FIELD = 64
#: The bytes a call line starts with, those between its id and its time, and those between
#: its time and its list of prompts (whose "[" is the last byte).
ID_HEAD = b'    {"id": "'
T_HEAD = b'", "t": '
PROMPTS_HEAD = b', "prompts": ['
# (as arrays: constants of the compiled function)
_ID_HEAD = np.frombuffer(ID_HEAD, dtype=np.uint8)
_T_HEAD = np.frombuffer(T_HEAD, dtype=np.uint8)
_PROMPTS_HEAD = np.frombuffer(PROMPTS_HEAD, dtype=np.uint8)
#: Where a line is shorter than this after its id's or its time's start, it is not the writer's.
AFTER_ID = 40
AFTER_TIME = 20

_NEWLINE, _QUOTE, _COMMA, _BACKSLASH, _CLOSE_BRACE = 10, 34, 44, 92, 125
_MINUS, _PLUS, _POINT, _ZERO, _NINE, _LOWER_E, _UPPER_E = 45, 43, 46, 48, 57, 101, 69

#: The decimal exponents the table of powers of five covers (a number of 19 digits or fewer
#: outside them is zero or infinite as a double: the block is left to msgspec).
SMALLEST_POWER, LARGEST_POWER = -342, 308


def _powers_of_five() -> np.ndarray:
    """The 128 most significant bits of 5**q for q from :data:`SMALLEST_POWER` to
    :data:`LARGEST_POWER`, two words (high, low) each: 5**q itself, truncated, for q >= 0; its
    reciprocal, rounded up, for q < 0 (``fast_float``'s ``table_generation.py``)."""
    low = (1 << 64) - 1
    negative: list[int] = []  # (q = -1, -2, ...: reversed below)
    power5 = 1
    for q in range(-1, SMALLEST_POWER - 1, -1):
        power5 *= 5
        z = power5.bit_length()  # (the least z with 2**z >= 5**-q: no power of five above 1 is one of two)
        c = (1 << (z + 127)) // power5 + 1 if q >= -27 else (1 << (2 * z + 128)) // power5 + 1
        c >>= max(c.bit_length() - 128, 0)
        negative += [c & low, c >> 64]
    words = negative[::-1]  # (high, low) pairs from q = SMALLEST_POWER up
    power5 = 1
    for _ in range(LARGEST_POWER + 1):
        width = power5.bit_length()
        c = power5 << (128 - width) if width < 128 else power5 >> (width - 128)
        words += [c >> 64, c & low]
        power5 *= 5
    return np.array(words, dtype=np.uint64)


_POWERS_OF_FIVE = _powers_of_five()
_U0, _U1, _U3, _U10 = (np.uint64(x) for x in (0, 1, 3, 10))
_LOW32, _U32, _U52, _U63 = np.uint64(0xFFFFFFFF), np.uint64(32), np.uint64(52), np.uint64(63)
_ALL_ONES, _PRECISION_MASK = np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(0x1FF)


def scan_call_lines(buf, last):
    """The fields of the call lines in ``buf`` (whole lines, each ending in a newline;
    ``last``: the file's last call is the last line, without its comma).

    Returns ``(ok, id_start, id_end, times, prompts, prompt_offsets, same)``: each line's
    id as ``buf[id_start:id_end]``; ``times``, every line's time (float64, as msgspec reads
    its JSON number); ``prompts``, every line's list of prompts one after another, line
    ``i``'s at ``prompts[prompt_offsets[i]:prompt_offsets[i + 1]]``; ``same``, whether every
    line's list is the first line's, byte for byte (then ``prompts`` holds the first line's
    list only: every line's is that list again). ``ok`` is ``False`` (and the rest empty)
    where any line is not as the writer writes a call.

    (One function with no helpers: numba compiles it alone, from this module that does not
    import numba.)"""
    n_bytes = len(buf)
    ok = n_bytes > 0 and buf[n_bytes - 1] == _NEWLINE
    most = n_bytes // AFTER_ID + 1 if ok else 0  # (lines shorter than that are refused)
    id_start = np.empty(most, dtype=np.int64)
    id_end = np.empty(most, dtype=np.int64)
    times = np.empty(most, dtype=np.float64)
    time_bits = times.view(np.uint64)  # (each time is made as its bits)
    prompts = np.empty(n_bytes if ok else 0, dtype=np.uint8)
    offsets = np.zeros(most + 1, dtype=np.int64)
    p_used = 0
    same = True
    start = 0
    line = 0
    while ok and start < n_bytes:
        # Each line is read once, field after field. A byte below 32 (a newline, a tab, a
        # carriage return, a control character) or 127 is not the writer's inside a line:
        # each loop below refuses one, so none reads past the line's newline (the block's
        # last byte is one).
        for k in range(len(_ID_HEAD)):
            if buf[start + k] != _ID_HEAD[k]:
                ok = False
                break
        if not ok:
            break
        # the id: up to its closing quote, printable ASCII without an escape
        i0 = start + len(_ID_HEAD)
        i1 = i0
        while i1 < i0 + SHORT_FIELD and buf[i1] != _QUOTE:
            if buf[i1] < 32 or buf[i1] >= 127 or buf[i1] == _BACKSLASH:
                ok = False
                break
            i1 += 1
        if not ok or i1 == i0 or i1 >= i0 + SHORT_FIELD:  # (else buf[i1] is the quote)
            ok = False
            break
        for k in range(len(_T_HEAD)):
            if buf[i1 + k] != _T_HEAD[k]:
                ok = False
                break
        if not ok:
            break
        # The time: a JSON number, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, then the
        # comma before the prompts. Its digits are read as an integer w (19 at most) and the
        # power of ten of the last one (each loop stops at a byte no number has: the line's
        # newline at the latest).
        t0 = i1 + len(_T_HEAD)
        k = t0
        c = buf[k]
        negative = c == _MINUS
        if negative:
            k += 1
            c = buf[k]
        w = _U0
        digits = 0
        power = 0
        if c == _ZERO:
            k += 1
            c = buf[k]
        elif _ZERO < c <= _NINE:
            while _ZERO <= c <= _NINE:
                if digits < 19:  # (more would overflow w: the block is then msgspec's)
                    w = w * _U10 + np.uint64(c - _ZERO)
                digits += 1
                k += 1
                c = buf[k]
        else:
            ok = False
        if ok and c == _POINT:
            k += 1
            c = buf[k]
            if not _ZERO <= c <= _NINE:
                ok = False
            while _ZERO <= c <= _NINE:
                if digits or c != _ZERO:  # (zeros before the first significant digit: power only)
                    if digits < 19:
                        w = w * _U10 + np.uint64(c - _ZERO)
                    digits += 1
                power -= 1
                k += 1
                c = buf[k]
        if ok and (c == _LOWER_E or c == _UPPER_E):
            k += 1
            c = buf[k]
            sign = 1
            if c == _MINUS or c == _PLUS:
                sign = -1 if c == _MINUS else 1
                k += 1
                c = buf[k]
            if not _ZERO <= c <= _NINE:
                ok = False
            exponent = 0
            while _ZERO <= c <= _NINE:
                if exponent < 100000:
                    exponent = exponent * 10 + (int(c) - _ZERO)
                k += 1
                c = buf[k]
            power += sign * exponent
        t1 = k
        if not ok or c != _COMMA or t1 - t0 >= SHORT_FIELD or digits > 19 \
                or (w != _U0 and not SMALLEST_POWER <= power <= LARGEST_POWER):
            ok = False
            break
        bits = _U0
        if w != _U0:
            # Eisel-Lemire: w normalised (its top bit set), times the 128-bit power of five,
            # gives the mantissa's 54 bits and whether it is exact enough to round
            lz = 0
            for width in (32, 16, 8, 4, 2, 1):
                if w >> np.uint64(64 - width) == _U0:
                    w <<= np.uint64(width)
                    lz += width
            at = 2 * (power - SMALLEST_POWER)
            hi, lo = _U0, _U0
            for half in range(2):
                b = _POWERS_OF_FIVE[at + half]
                # w * b, 128 bits, from 32-bit halves
                w_lo, w_hi, b_lo, b_hi = w & _LOW32, w >> _U32, b & _LOW32, b >> _U32
                ll, lh, hl = w_lo * b_lo, w_lo * b_hi, w_hi * b_lo
                mid = (ll >> _U32) + (lh & _LOW32) + (hl & _LOW32)
                p_hi = w_hi * b_hi + (lh >> _U32) + (hl >> _U32) + (mid >> _U32)
                p_lo = (mid << _U32) | (ll & _LOW32)
                if half == 0:
                    hi, lo = p_hi, p_lo
                    if hi & _PRECISION_MASK != _PRECISION_MASK:
                        break  # (the high word decides: the second word cannot change it)
                else:  # lo + p_hi, its carry into hi (a sum that wraps warns where this runs uncompiled)
                    room = _ALL_ONES - lo
                    if p_hi > room:
                        lo = p_hi - room - _U1
                        hi += _U1
                    else:
                        lo += p_hi
            if lo == _ALL_ONES and not -27 <= power <= 55:
                ok = False  # (undecided)
                break
            upper = np.int64(hi >> _U63)
            shift = np.uint64(upper + 9)
            mantissa = hi >> shift
            power2 = ((217706 * power) >> 16) + 63 + upper - lz + 1023
            if power2 <= 0:
                ok = False  # (subnormal)
                break
            # ties to even: a product exactly halfway rounds down where the mantissa is even
            if lo <= _U1 and -4 <= power <= 23 and mantissa & _U3 == _U1 and (mantissa << shift) == hi:
                mantissa &= ~_U1
            mantissa = (mantissa + (mantissa & _U1)) >> _U1
            if mantissa >= (np.uint64(2) << _U52):
                mantissa = _U1 << _U52
                power2 += 1
            if power2 >= 2047:
                ok = False  # (infinite)
                break
            bits = (mantissa & ~(_U1 << _U52)) | (np.uint64(power2) << _U52)
        if negative:
            bits |= _U1 << _U63
        time_bits[line] = bits
        for k in range(len(_PROMPTS_HEAD)):
            if buf[t1 + k] != _PROMPTS_HEAD[k]:
                ok = False
                break
        if not ok:
            break
        p0 = t1 + len(_PROMPTS_HEAD) - 1  # the list's "["
        # The list and the line's end. While every line's list is the first line's, this
        # one is compared with it (a byte the first's list has is the writer's) and, where
        # the line then ends as a call does, not copied.
        end = -1
        if same and line > 0:
            length = offsets[1]
            matched = True
            for k in range(length):
                if prompts[k] != buf[p0 + k]:
                    matched = False
                    break
            q = p0 + length
            if matched and buf[q] == _CLOSE_BRACE:
                if buf[q + 1] == _COMMA and buf[q + 2] == _NEWLINE and not (last and q + 2 == n_bytes - 1):
                    end = q + 2
                elif last and buf[q + 1] == _NEWLINE and q + 1 == n_bytes - 1:
                    end = q + 1
        copy = end < 0
        if copy:  # (the first line, or a list or an ending not the first line's)
            end = p0
            while buf[end] >= 32 and buf[end] != 127:
                end += 1
            if buf[end] != _NEWLINE:
                ok = False
                break
        if end - start < AFTER_ID or i1 + AFTER_ID > end or t1 + AFTER_TIME > end:
            ok = False
            break
        # the call's "}": each line ends "},", the file's last call's "}" alone
        final = last and end == n_bytes - 1
        closing = end - 1 if final else end - 2
        if buf[closing] != _CLOSE_BRACE or (not final and buf[closing + 1] != _COMMA):
            ok = False
            break
        id_start[line] = i0
        id_end[line] = i1
        length = closing - p0
        if copy:
            if same and line > 0:  # the first line's list differs from this one's
                same = False
                for k in range(offsets[1], p_used):  # the lines before, each the first line's list
                    prompts[k] = prompts[k - offsets[1]]
            for k in range(length):
                prompts[p_used + k] = buf[p0 + k]
        p_used += length
        line += 1
        offsets[line] = p_used
        start = end + 1
    if not ok:
        return False, id_start[:0], id_end[:0], times[:0], prompts[:0], offsets[:0], False
    return True, id_start[:line], id_end[:line], times[:line], prompts[:offsets[1] if same else p_used], \
        offsets[:line + 1], same
