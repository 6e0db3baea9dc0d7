"""Outputs are never destroyed or lost: special files written through or refused, one writer
at a time, full disks and read-only folders in one line naming the output, paths printed
escaped (simulator/outputs.py, simulator/sweep.py, simulator/errors.py)."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile_outputs as hostile  # noqa: E402

from simulator.errors import OutputError, shown  # noqa: E402
from simulator.outputs import open_output, output_lock, write_through  # noqa: E402


def chardev(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


# -- special files ---------------------------------------------------------------------------


def test_dev_null_is_written_through_and_stays_a_device():
    with open_output("/dev/null") as fh:  # no --force needed: nothing there to overwrite
        fh.write("x" * 100_000)
    assert chardev("/dev/null")


def test_dev_full_is_one_error_naming_it_and_stays_a_device():
    with pytest.raises(OutputError, match=r"^/dev/full: cannot write: no space left on the device$"):
        with open_output("/dev/full") as fh:
            fh.write("x" * 100_000)
    assert chardev("/dev/full")


def test_replay_json_onto_devices(tmp_path):
    code, _, err = hostile.invoke(["replay", str(hostile.small_trace()), "--json", "/dev/full", "--force"])
    assert code == 2 and err.strip() == "error: /dev/full: cannot write: no space left on the device"
    code, _, err = hostile.invoke(["replay", str(hostile.small_trace()), "--json", "/dev/null"])
    assert code == 0 and not err
    assert chardev("/dev/full") and chardev("/dev/null")


def test_fifo_without_reader_is_refused_at_once(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no process is reading"):
        with open_output(fifo) as fh:
            fh.write("x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_fifo_with_reader_gets_everything(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    done, got = threading.Event(), []
    reader = threading.Thread(target=hostile._drain, args=(fd, done, got))
    reader.start()
    try:
        with open_output(fifo) as fh:
            fh.write("y" * 300_000)  # more than a pipe holds: the writer waits for the reader
    finally:
        done.set()
        reader.join(60)
        os.close(fd)
    assert got == [b"y" * 300_000]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_socket_is_refused(tmp_path):
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.json"))
        with pytest.raises(OutputError, match="is a socket"):
            write_through(tmp_path / "s.json")
    assert stat.S_ISSOCK(os.lstat(tmp_path / "s.json").st_mode)


def test_descriptor_names_are_written_through():
    assert write_through("/dev/stdout") == "descriptor"
    assert write_through("/proc/self/fd/1") == "descriptor"
    assert write_through("/dev/null") == "device"


def test_json_to_dev_stdout_redirected_to_a_file_keeps_both(tmp_path):
    # The JSON and then the tables, one after the other, as a shell's redirection keeps them.
    out = tmp_path / "all.txt"
    got = hostile.finish(*hostile.start_simctl(["replay", str(hostile.small_trace()), "--json", "/dev/stdout",
                                                *hostile.NO_KERNEL], tmp_path, stdout=out))
    assert got.returncode == 0, got.stderr
    text = out.read_text()
    assert text.startswith("{") and '"overall"' in text and "Prompts per task" in text


# -- one writer at a time -----------------------------------------------------------------------


def test_second_writer_waits_then_is_refused_without_force(tmp_path):
    assert hostile.second_writer(tmp_path / "out.json", "--json", force=False, folder=tmp_path)


def test_second_writer_waits_then_replaces_with_force(tmp_path):
    assert hostile.second_writer(tmp_path / "out.csv", "--csv", force=True, folder=tmp_path)


def test_lock_wait_zero_refuses_naming_the_holder(tmp_path):
    assert hostile.refused_at_once(tmp_path / "out.json", tmp_path)


def test_lock_file_is_removed_and_lock_is_reentrant(tmp_path):
    target = tmp_path / "out.json"
    with output_lock(target):
        assert (tmp_path / ".out.json.lock").exists()
        with output_lock(target):  # the same process again: no deadlock
            pass
        with open_output(target) as fh:  # a sweep writes the file it holds
            fh.write("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_bad_lock_wait_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMCTL_LOCK_WAIT", "soon")
    with pytest.raises(OutputError, match="SIMCTL_LOCK_WAIT: expected seconds"):
        with output_lock(tmp_path / "x.json"):
            pass


@pytest.mark.parametrize("first,second", [("0,1", "0,1"), ("0,1", "2,3")])
def test_two_sweeps_into_one_file_keep_every_row_and_run_none_twice(tmp_path, first, second):
    assert hostile.two_sweeps(first, second, tmp_path)


# -- full disks, size limits, read-only folders ---------------------------------------------


@pytest.mark.parametrize("option,name", [("--json", "out.json"), ("--events", "out.parquet")])
def test_file_size_limit_is_one_line_and_keeps_the_previous_file(tmp_path, option, name):
    target = tmp_path / name
    target.write_bytes(hostile.PREVIOUS)
    got = hostile.run_simctl(["replay", str(hostile.small_trace()), option, str(target), "--force", *hostile.NO_KERNEL],
                             tmp_path, preexec=hostile._limit_file_size)
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip() == (f"error: {target}: cannot write: file too large (a file-size limit such as "
                                  "ulimit -f, or the file system's largest file); nothing was written, the file "
                                  "as it was is kept")
    assert target.read_bytes() == hostile.PREVIOUS and not hostile.leftovers(tmp_path)


def test_read_only_folder_names_the_output_not_its_temporary_file(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "out.csv"
    target.write_bytes(hostile.PREVIOUS)
    with hostile.read_only(folder):
        code, _, err = hostile.invoke(["replay", str(hostile.small_trace()), "--csv", str(target), "--force"])
    assert code == 2 and err.startswith(f"error: {target}: cannot write: ") and err.count("\n") == 1
    assert ".part" not in err and ".lock" not in err
    assert target.read_bytes() == hostile.PREVIOUS and not hostile.leftovers(folder)


def test_sweep_journal_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    from simulator import sweep

    def full(self, row):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep.ResultStore, "_append", full)
    out = tmp_path / "r.parquet"
    code, _, err = hostile.invoke(["sweep", str(hostile.small_trace()), "--flush", "0,1", "-j", "1", "-o", str(out)])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {out}: cannot save a finished row in r.parquet.journal: no space left")
    assert not out.exists() and not hostile.leftovers(tmp_path)


# -- names printed escaped -------------------------------------------------------------------


def test_control_characters_in_names_are_escaped():
    assert shown("a\x1b[31mb\n\u202ec\udcff") == "a\\x1b[31mb\\n\\u202ec\\udcff"
    assert shown("résumé 日本 plain.json") == "résumé 日本 plain.json"
    err = OutputError("x\x1b[31my\r.json", None, None, "file exists")
    assert str(err) == "x\\x1b[31my\\r.json: file exists"


def test_cli_error_with_an_escape_in_the_name(tmp_path):
    name = tmp_path / "x\x1b[31my.json"
    name.write_text("{}")
    code, _, err = hostile.invoke(["replay", str(hostile.small_trace()), "--json", str(name)])
    assert code == 2 and "\x1b" not in err and "x\\x1b[31my.json: file exists" in err


# -- the hostile classes, a few cases each ---------------------------------------------------


# Concurrent writers are left out here: their cases 0 to 3 (each a fresh process or two) are
# the one-writer-at-a-time tests above, case for case, and benchmarks/hostile_inputs.py's quick
# mode runs the class itself.
@pytest.mark.parametrize("klass,examples", [("outputs onto special files", 16), ("disk full and read-only", 8)])
def test_hostile_classes(klass, examples):
    tried, handled = hostile.CLASSES[klass](examples)
    assert tried == examples and handled == tried
