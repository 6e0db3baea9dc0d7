"""The compiled kernel's on-disk cache is keyed on every file the kernel is made of, so
editing or upgrading any of them compiles it anew instead of loading a stale kernel."""

from __future__ import annotations

import os
import shutil

from numba import njit
from numba.core import caching, event
from numba.core.dispatcher import Dispatcher

from simulator import notices
from simulator.model import batch_kernel, kernel_cache, kernel_service


def cached_functions():
    for module in (batch_kernel, kernel_service):
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and value._cache._impl is not None:
                yield value


def test_every_cached_kernel_function_keys_on_all_kernel_sources():
    functions = list(cached_functions())
    assert batch_kernel.run_kernel in functions and len(functions) > 5
    for function in functions:
        locator = function._cache._impl.locator
        assert type(locator).__name__.startswith("KernelSources")
        assert locator.get_source_stamp()[1] == kernel_cache.sources_digest()


def test_the_digest_follows_a_change_to_any_kernel_source(tmp_path, monkeypatch):
    package = tmp_path / "simulator"
    shutil.copytree(kernel_cache.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setattr(kernel_cache, "PACKAGE", package)
    kernel_cache.sources_digest.cache_clear()
    try:
        before = kernel_cache.sources_digest()
        table = package / "profile" / "kinds" / "table.py"
        table.write_text(table.read_text() + "\n# changed\n")
        kernel_cache.sources_digest.cache_clear()
        assert kernel_cache.sources_digest() != before
        (package / "cli" / "replay.py").write_text("# not a kernel source\n")
        kernel_cache.sources_digest.cache_clear()
        after = kernel_cache.sources_digest()
        table.write_text(table.read_text().replace("\n# changed\n", ""))
        kernel_cache.sources_digest.cache_clear()
        assert kernel_cache.sources_digest() == before != after
    finally:
        monkeypatch.undo()
        kernel_cache.sources_digest.cache_clear()


def test_the_stamp_is_the_sources_content_not_their_times():
    """A cache compiled elsewhere from the same sources (the wheel's packaged one) is valid
    here, whatever times installing gave the files."""
    locator = batch_kernel.run_kernel._cache._impl.locator
    source = kernel_cache.PACKAGE / "model" / "batch_kernel.py"
    before, times = locator.get_source_stamp(), source.stat()
    try:
        os.utime(source, (times.st_atime + 1000, times.st_mtime + 1000))
        assert locator.get_source_stamp() == before
    finally:
        os.utime(source, ns=(times.st_atime_ns, times.st_mtime_ns))


class _Locator:
    """A locator of numba's shape over a folder of ours (the cache numba reads and writes)."""

    def __init__(self, real, path):
        self.real, self.path = real, path

    def get_cache_path(self):
        return str(self.path)

    def get_source_stamp(self):
        return self.real.get_source_stamp()

    def get_disambiguator(self):
        return self.real.get_disambiguator()


def _index(path, base, stamp):
    return caching.IndexDataCacheFile(str(path), base, stamp)


def test_packaged_entries_are_copied_into_the_cache_numba_uses(tmp_path, monkeypatch):
    function = batch_kernel.group_prompts
    real = function._cache._impl.locator
    base = function._cache._impl.filename_base
    stamp = real.get_source_stamp()
    packaged = tmp_path / "packaged"
    monkeypatch.setattr(kernel_cache, "COMPILED", packaged)
    folder = packaged / "model"
    folder.mkdir(parents=True)
    # two packaged entries (as the precompile leaves them), one the user's cache has already
    _index(folder, base, stamp)._save_index({"sig-a": f"{base}.1.nbc", "sig-b": f"{base}.2.nbc"})
    (folder / f"{base}.1.nbc").write_bytes(b"compiled a")
    (folder / f"{base}.2.nbc").write_bytes(b"compiled b")
    user = tmp_path / "user"
    user.mkdir()
    _index(user, base, stamp)._save_index({"sig-b": f"{base}.1.nbc", "sig-c": f"{base}.2.nbc"})
    (user / f"{base}.1.nbc").write_bytes(b"user's b")
    (user / f"{base}.2.nbc").write_bytes(b"user's c")
    locator = _Locator(real, user)
    source = function.py_func.__code__.co_filename

    assert kernel_cache.seed(locator, function.py_func, source) == 1
    merged = _index(user, base, stamp)._load_index()
    assert set(merged) == {"sig-a", "sig-b", "sig-c"}
    assert (user / merged["sig-a"]).read_bytes() == b"compiled a"
    assert (user / merged["sig-b"]).read_bytes() == b"user's b"  # the user's own entries kept
    assert (user / merged["sig-c"]).read_bytes() == b"user's c"
    assert kernel_cache.seed(locator, function.py_func, source) == 0  # nothing left to copy

    # entries of other sources (another stamp) are never copied
    stale = tmp_path / "stale"
    _index(folder, base, ("sources", "another digest"))._save_index({"sig-d": f"{base}.1.nbc"})
    assert kernel_cache.seed(_Locator(real, stale), function.py_func, source) == 0
    assert not stale.exists()
    # nor anything when told to leave the packaged cache unread
    _index(folder, base, stamp)._save_index({"sig-a": f"{base}.1.nbc"})
    monkeypatch.setenv("SIMCTL_NO_PACKAGED_CACHE", "1")
    assert kernel_cache.seed(_Locator(real, stale), function.py_func, source) == 0


def _compile_event(dispatcher):
    return event.Event("numba:compile", event.EventStatus.START, data={"dispatcher": dispatcher, "args": ()})


def test_a_compile_of_the_kernel_is_announced_once(monkeypatch):
    listener = next(x for x in event._registered["numba:compile"] if isinstance(x, kernel_cache._FirstCompile))
    monkeypatch.setattr(listener, "said", False)
    said: list[str] = []
    event.broadcast(_compile_event(batch_kernel.run_kernel))  # no one to show it to: a library call
    assert said == [] and not listener.said
    monkeypatch.setattr(notices, "show", said.append)
    event.broadcast(_compile_event(njit(lambda x: x)))  # not the kernel's
    assert said == []
    event.broadcast(_compile_event(batch_kernel.run_kernel))
    event.broadcast(_compile_event(kernel_service.batch_service))
    assert said == [kernel_cache.COMPILING]


def test_the_cli_shows_notices_on_stderr_at_once(capsys):
    from simulator.cli._common import user_errors

    with user_errors():
        assert notices.say("a line")
        assert "a line" in capsys.readouterr().err  # before the command ends
    assert notices.show is None and not notices.say("unseen")
