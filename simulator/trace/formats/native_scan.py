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
_OPEN_LIST, _CLOSE_LIST = 91, 93


def scan_call_lines(buf, last):
    """The fields of the call lines in ``buf`` (whole lines, each ending in a newline;
    ``last``: the file's last call is the last line, without its comma).

    Returns ``(ok, id_start, id_end, times, prompts, prompt_offsets, same)``: each line's
    id as ``buf[id_start:id_end]``; ``times``, every line's time in order as one JSON list
    (``[t0,t1,...]``); ``prompts``, every line's list of prompts one after another, line
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
    times = np.empty(n_bytes + 2 if ok else 0, dtype=np.uint8)
    prompts = np.empty(n_bytes if ok else 0, dtype=np.uint8)
    offsets = np.zeros(most + 1, dtype=np.int64)
    t_used = 0
    p_used = 0
    same = True
    start = 0
    line = 0
    if ok:
        times[0] = _OPEN_LIST
        t_used = 1
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
        # the time: up to the comma before the prompts, copied as it is read
        t0 = i1 + len(_T_HEAD)
        t1 = t0
        while t1 < t0 + SHORT_FIELD and buf[t1] != _COMMA:
            if buf[t1] < 32 or buf[t1] == 127:
                ok = False
                break
            times[t_used + t1 - t0] = buf[t1]
            t1 += 1
        if not ok or t1 >= t0 + SHORT_FIELD:  # (else buf[t1] is the comma)
            ok = False
            break
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
        t_used += t1 - t0
        times[t_used] = _COMMA
        t_used += 1
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
    times[t_used - 1] = _CLOSE_LIST
    return True, id_start[:line], id_end[:line], times[:t_used], prompts[:offsets[1] if same else p_used], \
        offsets[:line + 1], same
