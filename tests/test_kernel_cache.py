"""The compiled kernel's on-disk cache is keyed on every file the kernel is made of, so
editing or upgrading any of them compiles it anew instead of loading a stale kernel."""

from __future__ import annotations

import shutil

from numba.core.dispatcher import Dispatcher

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
