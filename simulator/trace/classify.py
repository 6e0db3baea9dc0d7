"""Keyword rules that give a prompt text its task, and the token estimate for a text.

The users' load-testing client sends prompt *texts*; the serving system routes each by
keyword rules (``TaskRouter._classify_heuristic`` in the design notes). This module holds a
configurable version of those rules. A rule is a task plus one or more *groups* of
phrases; it matches a text when **every** group has at least one phrase that occurs in the
text (case-insensitive substring). Rules are tried in order; the first match wins; a text
no rule matches gets the task :data:`UNKNOWN`.

:data:`DEFAULT_CLASSIFIER` has, in this order:

* strong rules (one group each) —
  ``graph``: "directed graph", "undirected graph", "shortest path", "node 0 to node",
  "path from node", "you are given a graph";
  ``mmlu``: "multiple choice question";
  ``infobench``: "instruction:";
* weak rules (all-of groups) —
  ``graph``: ("node" or "vertex" or "vertices") and "edge";
  ``mmlu``: "options:" and "answer:".

Substring matching is deliberately plain (it is what the real router does): "edge" also
occurs in "knowledge", so the weak rules only run after every strong rule failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The task of a text that no rule matches.
UNKNOWN = "unknown"


def estimate_tokens(text: str) -> int:
    """Estimated number of tokens in ``text``: ``max(1, ceil(len(text) / 4))``.

    This is the common rule of thumb that English text averages about four characters per
    token with BPE tokenizers (GPT-2/Llama/Qwen families). It is an estimate: real token
    counts of code, numbers or non-English text differ. ``len`` counts Unicode code points.
    A text of ``4 * n`` characters estimates to exactly ``n`` tokens (for ``n >= 1``).
    """
    return max(1, math.ceil(len(text) / 4))


def _phrases(values: Sequence[str] | str, what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    out = []
    for value in values:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{what}: a phrase must be a non-empty string, got {value!r}")
        out.append(value.lower())
    if not out:
        raise ValueError(f"{what}: needs at least one phrase")
    return tuple(out)


@dataclass(frozen=True)
class KeywordRule:
    """``task`` matches a text when every group in ``groups`` has a phrase in the text.

    Phrases are stored lower-case and matched as case-insensitive substrings. A rule with
    one group is an "any of these phrases" rule; several groups make an "all of" rule,
    e.g. ``(("node", "vertex", "vertices"), ("edge",))``.
    """

    task: str
    groups: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"a rule's task must be a non-empty string, got {self.task!r}")
        if isinstance(self.groups, str) or not self.groups:
            raise ValueError(f"rule for task {self.task!r}: needs at least one group of phrases")
        groups = tuple(_phrases(g, f"rule for task {self.task!r}") for g in self.groups)
        object.__setattr__(self, "groups", groups)

    @classmethod
    def any_of(cls, task: str, phrases: Sequence[str]) -> KeywordRule:
        """A rule that matches when any of ``phrases`` occurs in the text."""
        return cls(task, (tuple(phrases),))

    @classmethod
    def all_of(cls, task: str, groups: Sequence[Sequence[str] | str]) -> KeywordRule:
        """A rule that matches when each group (a phrase or a list of alternatives) occurs."""
        return cls(task, tuple((g,) if isinstance(g, str) else tuple(g) for g in groups))

    def matches(self, lowered_text: str) -> bool:
        """Whether the rule matches ``lowered_text`` (already lower-cased)."""
        return all(any(p in lowered_text for p in group) for group in self.groups)


@dataclass(frozen=True)
class KeywordClassifier:
    """An ordered list of :class:`KeywordRule`; the first rule that matches gives the task.

    Build your own from dicts with :meth:`from_dict`, or from rules directly.
    """

    rules: tuple[KeywordRule, ...]
    unknown: str = UNKNOWN

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        for rule in self.rules:
            if not isinstance(rule, KeywordRule):
                raise TypeError(f"rules must be KeywordRule objects, got {rule!r}")

    @classmethod
    def from_dict(
        cls,
        phrases: Mapping[str, Sequence[str]],
        weak: Mapping[str, Sequence[Sequence[str] | str]] | None = None,
        unknown: str = UNKNOWN,
    ) -> KeywordClassifier:
        """Rules from ``{task: [phrase, ...]}`` (any of), then ``weak`` ``{task: [group, ...]}``.

        Each ``weak`` entry is an all-of rule: every group (a phrase, or a list of
        alternative phrases) must occur. Dict order is rule order: all ``phrases`` rules
        come before all ``weak`` rules.
        """
        rules = [KeywordRule.any_of(task, list(p)) for task, p in phrases.items()]
        rules += [KeywordRule.all_of(task, list(g)) for task, g in (weak or {}).items()]
        return cls(tuple(rules), unknown)

    @property
    def tasks(self) -> list[str]:
        """Tasks the rules can give, in order of their first rule."""
        return list(dict.fromkeys(rule.task for rule in self.rules))

    def classify(self, text: str) -> str:
        """The task of ``text``: the first matching rule's task, else ``self.unknown``."""
        lowered = text.lower()
        for rule in self.rules:
            if rule.matches(lowered):
                return rule.task
        return self.unknown

    def example_text(self, task: str) -> str | None:
        """A short text this classifier maps to ``task``, or ``None`` if none is found.

        Tries the task's rules in order; for each, joins the first phrase of every group.
        Used by writers that must invent prompt texts (the client format).
        """
        for rule in self.rules:
            if rule.task != task:
                continue
            text = " ".join(group[0] for group in rule.groups)
            if self.classify(text) == task:
                return text
        return None


DEFAULT_CLASSIFIER = KeywordClassifier.from_dict(
    {
        "graph": [
            "directed graph", "undirected graph", "shortest path", "node 0 to node",
            "path from node", "you are given a graph",
        ],
        "mmlu": ["multiple choice question"],
        "infobench": ["instruction:"],
    },
    weak={
        "graph": [["node", "vertex", "vertices"], "edge"],
        "mmlu": ["options:", "answer:"],
    },
)
