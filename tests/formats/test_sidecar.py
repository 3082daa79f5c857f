"""Checksum sidecars of foreign files (mmpack._src.formats.sidecar), through EOS-separated files:
verify_reads checks each stripe a read touches against the sidecar; a cache that cannot keep the
sidecar warns, and the sums are kept in memory."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _olmo import write_olmo

import mmpack
from mmpack import WindowDataset
from mmpack._src.formats.eos_separated import open_eos_separated
from mmpack.errors import FormatError

pytestmark = pytest.mark.usefixtures("foreign_cache")


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("npy", [False, True])
def test_verify_reads_checks_each_block_against_the_sidecar(tmp_path, npy):
    rng = np.random.default_rng(4)
    flat = rng.integers(1, 1000, 9 << 20).astype(np.uint16)  # 18 MiB: 16 MiB blocks 0 and 1
    flat[::500] = 0
    at = (16 << 20) + 1000  # in block 1, outside the first and last MiB (the fingerprint's)
    flat[at // 2] = 5  # its low byte flipped below: 21, never an EOS
    path = tmp_path / ("t.npy" if npy else "t.bin")
    if npy:
        np.save(path, flat)
    else:
        flat.tofile(path)
    opts = {"eos": 0} if npy else {"eos": 0, "format": "eos-separated", "dtype": "uint16"}
    first = mmpack.open(path, verify_reads=True, **opts)  # no sidecar yet: recorded now
    assert first.verify_reads and first.tokens is None
    assert (first.cache_dir / "checksums.json").is_file()
    np.testing.assert_array_equal(first.read_range(0, 1000), flat[:1000])
    header = os.path.getsize(path) - flat.nbytes
    _flip(path, header + at)  # after the open: the mapping serves the new byte
    with pytest.raises(FormatError, match=r"t\.(npy|bin) stripe 1 .* differs from the checksum"):
        first.read_range(flat.size - 60, flat.size)
    np.testing.assert_array_equal(first.read_range(10, 20), flat[10:20])  # block 0 is fine
    store = mmpack.open(path, verify_reads=True, **opts)
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        WindowDataset(store, 64)[len(WindowDataset(store, 64)) - 1]
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        pickle.loads(pickle.dumps(store)).read_range(flat.size - 60, flat.size)
    plain = mmpack.open(path, **opts)  # the default serves the mapping unchecked
    assert plain.read_range(flat.size - 60, flat.size).size == 60
    with pytest.raises(FormatError, match="stripe 1 .* differs"):
        plain.verify()


def _verify_in_read_only_cache(path, cache):
    """verify() with ``cache`` bind-mounted read-only in a private mount namespace."""
    script = (
        "import sys, warnings, mmpack\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    s = mmpack.open({str(path)!r}, format='eos-separated', eos=0, dtype='uint16', "
        f"cache_dir={str(cache)!r})\n"
        "    r = s.verify()\n"
        "print(r['recorded'], r['sidecar'], any('could not keep the checksum sidecar' in "
        "str(x.message) for x in w))\n"
    )
    mount = (
        f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache} && "
        f'{sys.executable} -c "$0"'
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )


def test_verify_with_a_read_only_cache_verifies_and_warns(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    out = _verify_in_read_only_cache(path, cache)
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"cannot mount read-only here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "None", "True"]
    assert not any(cache.rglob("*"))  # nothing could be written, nothing was


def test_verify_with_a_cache_path_through_a_file_warns_and_keeps_the_sums(tmp_path):
    path = tmp_path / "t.bin"
    write_olmo(path, [np.arange(1, 5), np.arange(1, 3)], eos=0)
    (tmp_path / "a-file").write_text("")
    with pytest.warns(UserWarning, match="could not cache the document index"):
        store = open_eos_separated(path, eos=0, dtype="uint16", cache_dir=tmp_path / "a-file" / "c")
    with pytest.warns(UserWarning, match="could not keep the checksum sidecar"):
        first = store.verify()
    assert first["recorded"] and first["sidecar"] is None and first["blocks"] == 1
    assert not store.verify()["recorded"]  # checked against the sums kept in memory
    _flip(path, 2)
    with pytest.raises(FormatError, match="recorded in memory"):
        store.verify()
