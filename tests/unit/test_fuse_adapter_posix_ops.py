"""The adapter hands fallocate and copy_file_range to the core with the arguments of its
interface and turns the core's FsError into the errno the kernel gets."""
from __future__ import annotations

import errno
from types import SimpleNamespace

import pytest
import trio

pyfuse3 = pytest.importorskip("pyfuse3")

from delvefs.client.mount.errors import FsError  # noqa: E402
from delvefs.client.mount.fuse_adapter import Adapter  # noqa: E402


class RecordingCore(SimpleNamespace):
    """Only what the adapter needs for these two requests."""

    def __init__(self, answer=None):
        super().__init__(writeback_cache=False, calls=[])
        self.answer = answer

    async def fallocate(self, ino, fh, mode, offset, length):
        self.calls.append(("fallocate", ino, fh, mode, offset, length))
        if isinstance(self.answer, Exception):
            raise self.answer

    async def copy_file_range(self, fh_in, off_in, fh_out, off_out, length, flags):
        self.calls.append(("copy_file_range", fh_in, off_in, fh_out, off_out, length, flags))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_fallocate_reaches_the_core():
    core = RecordingCore()
    trio.run(Adapter(core).fallocate, 7, 1001, 0x10, 4096, 8192)
    assert core.calls == [("fallocate", 7, 1001, 0x10, 4096, 8192)]


def test_copy_file_range_reaches_the_core_and_answers_its_count():
    core = RecordingCore(answer=300_000)
    copied = trio.run(Adapter(core).copy_file_range, 7, 1001, 0, 8, 1002, 0, 300_000, 0)
    assert copied == 300_000
    assert core.calls == [("copy_file_range", 1001, 0, 1002, 0, 300_000, 0)]


@pytest.mark.parametrize("err", [errno.EOPNOTSUPP, errno.EXDEV, errno.EIO])
def test_the_cores_refusal_becomes_its_errno(err):
    adapter = Adapter(RecordingCore(answer=FsError(err)))
    with pytest.raises(pyfuse3.FUSEError) as raised:
        trio.run(adapter.copy_file_range, 7, 1001, 0, 8, 1002, 0, 10, 0)
    assert raised.value.errno == err
    with pytest.raises(pyfuse3.FUSEError) as raised:
        trio.run(adapter.fallocate, 7, 1001, 0, 0, 10)
    assert raised.value.errno == err
