"""The profiles, scenarios and traces that ship with simctl, addressable by name.

A bundled file is named by its stem: ``-p seed-calibrated``, ``-c design-notes``, and the
trace ``example`` (the synthetic stand-in for the users' production trace,
``batch_arrivals.json``) or any bundled trace's stem. An installed wheel carries copies of
the repository's top-level ``profiles/``, ``scenarios/``, ``traces/`` and ``prices/`` folders inside the
package (``simulator/_bundled/``, copied at build time by ``setup.py``); a checkout or an
editable install reads the top-level folders themselves, so there is one copy in git.

Profiles the user measures (``simctl profile``) go to :func:`user_profiles_dir`, which name
look-ups search too; a name there never shadows a bundled one (the bundled file wins and the
profiler refuses to write such a name by default).

Resolution, everywhere: an existing path wins; else a bundled name; else a one-line error
listing the names that exist.
"""

from __future__ import annotations

import os
from pathlib import Path

from simulator.errors import SimctlError

_PACKAGE = Path(__file__).resolve().parent
#: Where the wheel keeps its copies (absent in a checkout).
INSTALLED = _PACKAGE / "_bundled"
#: The repository's top level (used when INSTALLED is absent).
CHECKOUT = _PACKAGE.parent

#: Bundled kinds: folder name and the suffixes of its files.
KINDS = {"profiles": (".json",), "scenarios": (".toml",), "traces": (".json", ".csv", ".jsonl"),
         "prices": (".json",)}
#: Names that stand for a bundled file of another stem.
ALIASES = {"traces": {"example": "batch_arrivals"}}


def folder(kind: str) -> Path:
    """The folder holding the bundled files of ``kind`` (profiles, scenarios, traces)."""
    installed = INSTALLED / kind
    return installed if installed.is_dir() else CHECKOUT / kind


def user_profiles_dir() -> Path:
    """Where ``simctl profile`` writes by default: ``$SIMCTL_HOME/profiles``, else
    ``$XDG_DATA_HOME/simctl/profiles`` (``~/.local/share/simctl/profiles``)."""
    home = os.environ.get("SIMCTL_HOME")
    if home:
        return Path(home).expanduser() / "profiles"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "simctl" / "profiles"


def _files(kind: str) -> dict[str, Path]:
    base = folder(kind)
    if not base.is_dir():
        return {}
    found = {p.stem: p for p in sorted(base.iterdir()) if p.suffix in KINDS[kind] and p.is_file()}
    for alias, stem in ALIASES.get(kind, {}).items():
        if stem in found:
            found[alias] = found[stem]
    return found


def names(kind: str) -> list[str]:
    """The names of the bundled files of ``kind``, aliases first."""
    files = _files(kind)
    aliases = [a for a in ALIASES.get(kind, {}) if a in files]
    return aliases + sorted(n for n in files if n not in aliases)


def find(kind: str, name: str) -> Path | None:
    """The bundled file of ``kind`` called ``name`` (stem, alias or file name), or None."""
    files = _files(kind)
    if name in files:
        return files[name]
    stem = Path(name).stem if Path(name).suffix in KINDS[kind] else None
    if stem and Path(name).name == name and stem in files:
        return files[stem]
    if kind == "profiles":
        user = user_profiles_dir() / f"{name}.json"
        if user.is_file():
            return user
    return None


def resolve(kind: str, name_or_path: str | Path, error: type[SimctlError]) -> Path:
    """An existing path as given, else the bundled file of that name; ``error`` otherwise."""
    candidate = Path(name_or_path).expanduser()
    if candidate.exists() or candidate.is_symlink():
        return candidate
    found = find(kind, str(name_or_path))
    if found is not None:
        return found
    what = kind[:-1]
    raise error(str(name_or_path), None, None,
                f"no such file, and no bundled {what} of that name (bundled: {', '.join(names(kind)) or 'none'})")
