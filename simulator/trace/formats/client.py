"""The users' load-testing client format, ``batch_arrivals.json``.

A JSON list of records, one per call::

    {"batch_id": 0, "batch_size": 2, "arrival_time": 3.09,
     "prompts": ["The following is a multiple choice question ...", "..."],
     "max_length": 2048, "prompt_idxs": [236, 251]}

Reading: each record is one :class:`Call` with ``id = str(batch_id)`` and ``t =
arrival_time`` (seconds; absolute epochs are shifted to start at 0 as in the native
format). Each prompt text becomes a :class:`Prompt` whose task is given by the keyword
classifier (:mod:`simulator.trace.classify`), ``prompt_tokens = estimate_tokens(text)``,
``max_tokens = max_length`` (``None`` if the record has none) and ``text`` the text
itself. Prompts no rule matches keep the task ``"unknown"``, with one warning per file.
``batch_size`` and ``prompt_idxs`` are optional; where given they must agree with
``prompts``.

Writing: the inverse, see :func:`write_client`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import IO, Any

from simulator.errors import SimctlWarning, TraceError
from simulator.trace.classify import DEFAULT_CLASSIFIER, UNKNOWN, KeywordClassifier, estimate_tokens
from simulator.trace.formats._common import (
    CallRecord,
    UnknownFields,
    build_trace,
    check_count,
    is_int,
    json_default,
    parse_time,
    show,
    type_name,
)
from simulator.trace.model import Prompt, Trace

#: ``max_length`` written for a call none of whose prompts has ``max_tokens`` (the value
#: the users' client sends).
DEFAULT_MAX_LENGTH = 2048
_KEYS = ("batch_id", "batch_size", "arrival_time", "prompts", "max_length", "prompt_idxs")
#: Neutral words for padding invented prompt texts; none contains a keyword of the
#: default rules.
_FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


def read_client(
    obj: Any, path: str | Path, classifier: KeywordClassifier = DEFAULT_CLASSIFIER
) -> Trace:
    """The :class:`Trace` of parsed client-format JSON ``obj`` read from ``path``.

    Raises :class:`TraceError` for any invalid record; warns (:class:`SimctlWarning`)
    about prompts classified ``unknown``, unsorted calls and ignored fields.
    """
    path = Path(path)
    if not isinstance(obj, list):
        raise TraceError(path, None, None, f"expected a JSON list of batches, got {type_name(obj)}")
    unknown_fields = UnknownFields()
    unclassified: list[tuple[int, int]] = []
    records = []
    for i, rec in enumerate(obj):
        records.append(_read_record(path, i, rec, classifier, unknown_fields, unclassified))
    unknown_fields.warn(path)
    if unclassified:
        first_rec, first_prompt = unclassified[0]
        warnings.warn(SimctlWarning(
            f"{path}: {len(unclassified)} prompt(s) matched no task rule; kept them as task "
            f"'{classifier.unknown}' (first: record {first_rec}, prompts[{first_prompt}])"
        ), stacklevel=3)
    meta: dict[str, Any] = {"format": "client"}
    return build_trace(path, records, meta, id_field="batch_id")


def _read_record(
    path: Path,
    i: int,
    rec: Any,
    classifier: KeywordClassifier,
    unknown_fields: UnknownFields,
    unclassified: list[tuple[int, int]],
) -> CallRecord:
    if not isinstance(rec, dict):
        raise TraceError(path, i, None, f"must be an object with 'batch_id', 'arrival_time' and 'prompts', got {show(rec)}")
    unknown_fields.note(i, rec, _KEYS)

    if "batch_id" not in rec:
        raise TraceError(path, i, "batch_id", "missing")
    batch_id = rec["batch_id"]
    if not is_int(batch_id):
        raise TraceError(path, i, "batch_id", f"must be an integer, got {show(batch_id)}")

    if "arrival_time" not in rec:
        raise TraceError(path, i, "arrival_time", "missing (seconds from the start of the trace)")
    t, is_iso = parse_time(path, i, "arrival_time", rec["arrival_time"])

    if "prompts" not in rec:
        raise TraceError(path, i, "prompts", "missing (a batch needs at least one prompt)")
    texts = rec["prompts"]
    if not isinstance(texts, list):
        raise TraceError(path, i, "prompts", f"must be a list of prompt texts, got {type_name(texts)}")
    if not texts:
        raise TraceError(path, i, "prompts", "is empty (a batch needs at least one prompt)")
    for j, text in enumerate(texts):
        if not isinstance(text, str):
            raise TraceError(path, i, f"prompts[{j}]", f"must be a prompt text (a string), got {show(text)}")

    max_length = rec.get("max_length")
    if max_length is not None:
        max_length = check_count(path, i, "max_length", max_length, 1)
    if rec.get("batch_size") is not None:
        size = check_count(path, i, "batch_size", rec["batch_size"], 1)
        if size != len(texts):
            raise TraceError(path, i, "batch_size", f"is {size} but the batch has {len(texts)} prompt(s)")
    idxs = rec.get("prompt_idxs")
    if idxs is not None:
        if not isinstance(idxs, list) or not all(is_int(x) for x in idxs):
            raise TraceError(path, i, "prompt_idxs", f"must be a list of integers, got {show(idxs)}")
        if len(idxs) != len(texts):
            raise TraceError(path, i, "prompt_idxs", f"has {len(idxs)} entries but the batch has {len(texts)} prompt(s)")

    prompts = []
    for j, text in enumerate(texts):
        task = classifier.classify(text)
        if task == classifier.unknown:
            unclassified.append((i, j))
        prompts.append(Prompt(task, estimate_tokens(text), max_length, text))
    return CallRecord(i, str(batch_id), t, is_iso, "arrival_time", tuple(prompts))


def placeholder_text(task: str, tokens: int | None, classifier: KeywordClassifier = DEFAULT_CLASSIFIER) -> str:
    """An invented prompt text that ``classifier`` maps to ``task``, about ``tokens`` long.

    The text is the classifier's :meth:`~KeywordClassifier.example_text` for the task (or
    ``"[task: NAME]"`` if it has none) padded with neutral filler words to exactly
    ``4 * tokens`` characters, so :func:`estimate_tokens` gives back ``tokens``. When the
    keyword alone is longer than that (``tokens`` below about 7), the text is the keyword
    alone and estimates to a few tokens more; ``tokens`` ``None`` gives the keyword alone.
    """
    head = classifier.example_text(task) or f"[task: {task}]"
    if tokens is None:
        return head
    target = 4 * max(tokens, 1)
    if len(head) >= target:
        return head
    text = head + ". "
    while len(text) < target:
        text += _FILLER
    text = text[:target]
    # never end on a space: a reader might strip it and change the estimate
    return text[:-1] + "." if text.endswith(" ") else text


def client_records(trace: Trace, classifier: KeywordClassifier = DEFAULT_CLASSIFIER) -> list[dict[str, Any]]:
    """The client-format records of ``trace`` (see :func:`write_client`)."""
    ids = [c.id for c in trace.calls]
    use_ids = all(i.isdecimal() for i in ids) and len(set(int(i) for i in ids)) == len(ids)
    records = []
    index = 0
    unmapped: dict[str, None] = {}
    for n, call in enumerate(trace.calls):
        texts = []
        for p in call.prompts:
            if p.text is not None:
                texts.append(p.text)
                continue
            text = placeholder_text(p.task, p.prompt_tokens, classifier)
            if classifier.classify(text) != p.task:
                unmapped.setdefault(p.task, None)
            texts.append(text)
        max_tokens = [p.max_tokens for p in call.prompts if p.max_tokens is not None]
        records.append({
            "batch_id": int(call.id) if use_ids else n,
            "arrival_time": call.t,
            "batch_size": len(call.prompts),
            "prompt_idxs": list(range(index, index + len(call.prompts))),
            "prompts": texts,
            "max_length": max(max_tokens) if max_tokens else DEFAULT_MAX_LENGTH,
        })
        index += len(call.prompts)
    if unmapped:
        names = ", ".join(repr(t) for t in unmapped)
        warnings.warn(SimctlWarning(
            f"no keyword rule gives task(s) {names}; their invented prompt texts will read "
            f"back as '{UNKNOWN}'"
        ), stacklevel=3)
    return records


def write_client(trace: Trace, handle: IO[str], classifier: KeywordClassifier = DEFAULT_CLASSIFIER) -> None:
    """Write ``trace`` to ``handle`` in the client format, one batch a line.

    * ``batch_id``: the call id if every id is a distinct decimal integer, else the call's
      index in the trace.
    * ``arrival_time``: the call's ``t``; ``batch_size``: its number of prompts.
    * ``prompt_idxs``: running indices 0, 1, 2, ... over the whole trace.
    * ``prompts``: each prompt's ``text``; a prompt without text gets
      :func:`placeholder_text` (a keyword of its task padded to ``4 * prompt_tokens``
      characters), so reading the file back gives the same task and ``prompt_tokens``.
      A task the classifier has no rule for is warned about.
    * ``max_length``: the largest ``max_tokens`` of the call's prompts, or 2048 if none
      has one. The format has one value per call and no meta: per-prompt ``max_tokens``
      and the trace's ``meta`` are not kept.
    """
    records = client_records(trace, classifier)
    handle.write("[")
    for n, record in enumerate(records):
        handle.write(("\n  " if n == 0 else ",\n  ") + json.dumps(record, default=json_default))
    handle.write("\n]\n")

