"""The compiled kernel's on-disk cache is keyed on every file the kernel is made of, so
editing or upgrading any of them compiles it anew instead of loading a stale kernel."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
from numba import njit
from numba.core import caching, event
from numba.core.dispatcher import Dispatcher

from simulator import notices
from simulator.model import batch_kernel, kernel_cache, kernel_service, kernel_sources, precompile


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
    monkeypatch.setattr(kernel_sources, "PACKAGE", package)
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


def _function():
    """A kernel function, its real locator, the base of its cache files' names and its stamp."""
    function = batch_kernel.group_prompts
    real = function._cache._impl.locator
    return function, real, function._cache._impl.filename_base, real.get_source_stamp()


def test_packaged_entries_are_copied_into_the_cache_numba_uses(tmp_path):
    _, _, base, stamp = _function()
    packaged = tmp_path / "packaged"
    packaged.mkdir()
    # two packaged entries (as the precompile leaves them), one the user's cache has already
    _index(packaged, base, stamp)._save_index({"sig-a": f"{base}.1.nbc", "sig-b": f"{base}.2.nbc"})
    (packaged / f"{base}.1.nbc").write_bytes(b"compiled a")
    (packaged / f"{base}.2.nbc").write_bytes(b"compiled b")
    user = tmp_path / "user"
    user.mkdir()
    _index(user, base, stamp)._save_index({"sig-b": f"{base}.1.nbc", "sig-c": f"{base}.2.nbc"})
    (user / f"{base}.1.nbc").write_bytes(b"user's b")
    (user / f"{base}.2.nbc").write_bytes(b"user's c")

    assert kernel_cache.seed(user, packaged, base, stamp) == 1
    merged = _index(user, base, stamp)._load_index()
    assert set(merged) == {"sig-a", "sig-b", "sig-c"}
    assert (user / merged["sig-a"]).read_bytes() == b"compiled a"
    assert (user / merged["sig-b"]).read_bytes() == b"user's b"  # the user's own entries kept
    assert (user / merged["sig-c"]).read_bytes() == b"user's c"
    assert kernel_cache.seed(user, packaged, base, stamp) == 0  # nothing left to copy

    # entries of other sources (another stamp) are never copied
    stale = tmp_path / "stale"
    assert kernel_cache.seed(stale, packaged, base, ("sources", "another digest")) == 0
    assert not stale.exists()


def test_an_index_of_another_numba_version_is_not_copied(tmp_path):
    """A wheel built with another numba than the one installed (an isolated build resolving
    a newer one): numba's version check leaves its entries unread, so the first replay compiles."""
    _, _, base, stamp = _function()
    packaged = tmp_path / "packaged"
    packaged.mkdir()
    _index(packaged, base, stamp)._save_index({"sig-a": f"{base}.1.nbc"})
    (packaged / f"{base}.1.nbc").write_bytes(b"compiled a")
    index = packaged / f"{base}.nbi"
    with open(index, "rb") as f:
        version = pickle.load(f)
        rest = f.read()
    with open(index, "wb") as f:
        pickle.dump(version + ".other", f, protocol=-1)
        f.write(rest)
    user = tmp_path / "user"
    assert kernel_cache.seed(user, packaged, base, stamp) == 0
    assert not user.exists()


def _packaged_cache(tmp_path, monkeypatch, **stamp_changes):
    """A packaged cache of one entry of a kernel function, its stamp this process's unless
    ``stamp_changes`` say otherwise; the folder its entry goes into and its files' base."""
    function, real, base, stamp = _function()
    compiled = tmp_path / "compiled"
    folder = compiled / "model"
    folder.mkdir(parents=True)
    _index(folder, base, stamp)._save_index({"sig-a": f"{base}.1.nbc"})
    (folder / f"{base}.1.nbc").write_bytes(b"compiled a")
    import numba

    key = {"sources": kernel_cache.sources_digest(), "numba": numba.__version__, "python": kernel_cache.python_tag(),
           "codegen": ["x86_64", "some cpu", "+some"], **stamp_changes}
    (compiled / kernel_cache.STAMP).write_text(json.dumps(key))
    monkeypatch.setattr(kernel_cache, "COMPILED", compiled)
    monkeypatch.setattr(kernel_cache, "_checked", set())
    monkeypatch.setattr(kernel_cache, "_to_merge", {})
    kernel_cache.packaged_key.cache_clear()
    monkeypatch.delenv(kernel_cache.NO_PACKAGED_CACHE, raising=False)
    return function, real, base


def test_a_cache_folder_is_seeded_once_then_marked(tmp_path, monkeypatch):
    function, real, base = _packaged_cache(tmp_path, monkeypatch)
    # an index the cache lacks is copied as it is, unread: the types its entries name may
    # belong to a module still being imported
    index = tmp_path / "compiled" / "model" / f"{base}.nbi"
    index.write_bytes(index.read_bytes() + b"unread")
    user = tmp_path / "user"
    py_func, source = function.py_func, function.py_func.__code__.co_filename
    try:
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 1
        assert (user / f"{base}.nbi").read_bytes() == index.read_bytes()
        assert (user / f"{base}.1.nbc").read_bytes() == b"compiled a"
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 0  # once a process
        markers = list(user.glob(".simctl-packaged-*"))
        assert len(markers) == 1
        # another process: the marker alone says the folder holds this packaged cache
        kernel_cache._checked.clear()
        (user / f"{base}.nbi").unlink()
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 0
        markers[0].unlink()
        kernel_cache._checked.clear()
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 1
        # nothing when told to leave the packaged cache unread
        kernel_cache._checked.clear()
        monkeypatch.setenv(kernel_cache.NO_PACKAGED_CACHE, "1")
        assert kernel_cache.seed_folder(_Locator(real, tmp_path / "other"), py_func, source) == 0
    finally:
        kernel_cache.packaged_key.cache_clear()


def test_an_index_the_cache_holds_already_is_merged_as_its_function_is_met(tmp_path, monkeypatch):
    function, real, base = _packaged_cache(tmp_path, monkeypatch)
    user = tmp_path / "user"
    user.mkdir()
    stamp = real.get_source_stamp()
    _index(user, base, stamp)._save_index({"sig-b": f"{base}.1.nbc"})
    (user / f"{base}.1.nbc").write_bytes(b"user's b")
    py_func, source = function.py_func, function.py_func.__code__.co_filename
    try:
        # met first through another function of the folder: nothing copied, nothing merged
        other = batch_kernel.run_kernel.py_func
        assert kernel_cache.seed_folder(_Locator(real, user), other, source) == 0
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 1
        merged = _index(user, base, stamp)._load_index()
        assert {k: (user / v).read_bytes() for k, v in merged.items()} == {"sig-a": b"compiled a",
                                                                           "sig-b": b"user's b"}
        assert kernel_cache.seed_folder(_Locator(real, user), py_func, source) == 0
    finally:
        kernel_cache.packaged_key.cache_clear()


@pytest.mark.parametrize("change", [{"numba": "0.1"}, {"python": "2.7"}, {"sources": "another digest"}])
def test_a_packaged_cache_for_another_numba_python_or_sources_is_not_read(tmp_path, monkeypatch, change):
    function, real, _ = _packaged_cache(tmp_path, monkeypatch, **change)
    user = tmp_path / "user"
    try:
        assert kernel_cache.packaged_key() is None
        assert kernel_cache.seed_folder(_Locator(real, user), function.py_func, function.py_func.__code__.co_filename) == 0
        assert not user.exists()
    finally:
        kernel_cache.packaged_key.cache_clear()


def test_the_precompile_reuses_a_folder_only_where_its_stamp_is_this_interpreters(tmp_path, monkeypatch):
    key = precompile.build_key()
    assert key["sources"] == kernel_cache.sources_digest() and key["codegen"]
    folder = tmp_path / "checkout-compiled"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "f.nbi").write_bytes(b"index")
    (folder / kernel_cache.STAMP).write_text(json.dumps(key))
    compiles: list[object] = []
    monkeypatch.setattr(precompile.subprocess, "run", lambda *a, **k: compiles.append(a))

    out = tmp_path / "build" / "_compiled"
    assert precompile.precompile(out, reuse=folder) == (1, True)
    assert (out / "model" / "f.nbi").read_bytes() == b"index" and compiles == []

    for part, value in [("numba", "0.1"), ("codegen", ["x86_64", "another cpu", ""]), ("sources", "x")]:
        (folder / kernel_cache.STAMP).write_text(json.dumps({**key, part: value}))
        assert not precompile.reusable(folder)
        with pytest.raises(FileNotFoundError):  # (the compile, not run here, wrote no stamp)
            precompile.precompile(out, reuse=folder)
        assert len(compiles) == 1
        compiles.clear()
    assert not list(out.parent.glob(".compiled-*"))  # nothing half-made left beside it


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


def test_a_replay_with_an_empty_numba_cache_loads_the_packaged_kernel(tmp_path):
    """The checkout's packaged cache (``make env`` compiles it) seeds an empty numba cache in
    a fresh process: every kernel function a replay calls is loaded, none compiled. Loading
    it skips numba's BLAS probe (no scipy.linalg imported), and scipy.linalg imports as
    usual afterwards."""
    if not precompile.reusable(kernel_cache.COMPILED):
        pytest.skip("simulator/model/_compiled/ is not current: python -m simulator.model.precompile")
    code = ("import simulator as sim\nfrom numba.core.dispatcher import Dispatcher\n"
            "from simulator.model import batch_kernel, kernel_service\n"
            "sim.replay('example', sim.build_scenario(path='design-notes', run={'engine': 'fast'}))\n"
            "fs = [f for m in (batch_kernel, kernel_service) for f in vars(m).values() if isinstance(f, Dispatcher)]\n"
            "import sys\nassert 'scipy.linalg' not in sys.modules, 'the kernel load probed BLAS'\n"
            "import scipy.linalg, numpy\nassert scipy.linalg.cython_blas and scipy.linalg.det(numpy.eye(2)) == 1\n"
            "print(sum(sum(f.stats.cache_hits.values()) for f in fs), "
            "sum(sum(f.stats.cache_misses.values()) for f in fs))\n")
    env = {k: v for k, v in os.environ.items() if k != kernel_cache.NO_PACKAGED_CACHE}
    # (numba's kernel: where the extension is usable a replay never loads numba)
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONPATH=str(kernel_cache.PACKAGE.parent),
               SIMCTL_NO_EXTENSION="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    hits, misses = map(int, done.stdout.split())
    assert hits >= 1 and misses == 0


def test_the_blas_probe_is_skipped_only_before_numba_runs_it_and_in_a_lone_thread(monkeypatch):
    """Within the block an import of the probed module fails at once, and imports as usual
    after it; where numba's array functions are loaded already, or another thread runs
    (it might import scipy.linalg meanwhile), the block changes nothing. (The count of
    threads is injected: a suite's own helper threads come and go.)"""
    import importlib

    probe = "tabnanny"  # a standard module no test imports, standing in for scipy's BLAS bindings
    threads = [1]
    monkeypatch.setattr(kernel_cache.threading, "active_count", lambda: threads[0])
    monkeypatch.setattr(kernel_cache, "BLAS_PROBE", probe)
    monkeypatch.delitem(sys.modules, probe, raising=False)
    monkeypatch.delitem(sys.modules, "numba.np.arraymath", raising=False)
    with kernel_cache.without_blas_probe(), pytest.raises(ImportError):
        importlib.import_module(probe)
    assert probe not in sys.modules
    threads[0] = 2
    with kernel_cache.without_blas_probe():
        assert importlib.import_module(probe).__name__ == probe
    threads[0] = 1
    monkeypatch.delitem(sys.modules, probe)
    monkeypatch.setitem(sys.modules, "numba.np.arraymath", sys.modules["sys"])
    with kernel_cache.without_blas_probe():
        assert importlib.import_module(probe).__name__ == probe
