"""Documents shuffled at build (``shuffle_docs=`` / ``--shuffle-docs SEED``,
:mod:`mmpack._src.store.doc_order`): the stored documents are exactly a permutation of the input,
in the order a slow Python twin of the keyed permutation computes, the same for a seed and
different across seeds; a failed, interrupted or killed shuffled build leaves nothing that opens
and no temporary store; ingest, the CLI and distributed builds (Dask on 127.0.0.1) shuffle too.

Run: ``PYTHONPATH=$PWD python -m pytest -q tests/store/test_doc_order.py``
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mmpack
import mmpack._src.store.doc_order as DO
import mmpack.errors
from mmpack import build
from mmpack.ingest import ingest
from mmpack.store import DOC_ORDER_STREAM, StoreWriter

# -- the slow Python twin of the order ------------------------------------------------------------

_MASK64 = 2**64 - 1


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def ref_order(n: int, seed) -> list[int]:
    """Input document of each store position: a balanced Feistel network over the smallest even
    bit width holding n - 1, keyed by ``(DOC_ORDER_STREAM, *seed)`` (epoch 0), cycle-walked."""
    if n <= 1:
        return list(range(n))
    parts = (DOC_ORDER_STREAM, *(seed if isinstance(seed, tuple) else (seed,)))
    words = [len(parts)]
    for s in parts:
        words += [s % 2**32, s // 2**32]
    base = [int(k) for k in np.random.SeedSequence(words).generate_state(8, np.uint64)]
    golden = 0x9E3779B97F4A7C15
    keys = [_mix(b ^ _mix(((r + 1) * golden) % 2**64)) for r, b in enumerate(base)]
    half = max(1, (len(bin(n - 1)) - 2 + 1) // 2)
    mask = 2**half - 1
    out = []
    for i in range(n):
        x = i
        while True:
            left, right = x >> half, x & mask
            for key in keys:
                left, right = right, left ^ (_mix(right ^ key) & mask)
            x = (left << half) | right
            if x < n:
                break
        out.append(x)
    return out


def _docs_of(store) -> list[list[int]]:
    return [store[j].tolist() for j in range(len(store))]


def _corpus(seed: int, n: int, top: int = 300, longest: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, top, int(rng.integers(0, longest))).tolist() for _ in range(n)]


# -- the order ------------------------------------------------------------------------------------


@given(
    docs=st.lists(st.lists(st.integers(0, 70_000), max_size=12), max_size=60),
    seed=st.integers(0, 2**64 - 1),
    buffer_tokens=st.sampled_from([1, 7, 1 << 23]),
)
def test_order_is_the_keyed_permutation_of_the_twin(tmp_path_factory, docs, seed, buffer_tokens):
    path = tmp_path_factory.mktemp("s") / "s"
    store = build(path, docs, shuffle_docs=seed, buffer_tokens=buffer_tokens)
    order = ref_order(len(docs), seed)
    assert _docs_of(store) == [docs[i] for i in order]  # each document intact, in the order
    assert sorted(map(tuple, _docs_of(store))) == sorted(map(tuple, docs))  # the multiset
    plain = build(path.with_name("plain"), docs)
    assert store.dtype == plain.dtype and store.num_tokens == plain.num_tokens
    assert store.meta["order"] == {
        "documents": "keyed",
        "seed": seed,
        "key": [DOC_ORDER_STREAM, seed],
    }
    store.verify()
    assert sorted(os.listdir(path.parent)) == ["plain", "s"]


def test_doc_order_kernel_path_matches_the_twin():
    for n in (0, 1, 2, 3, 17, 1000, 4099):
        for seed in (0, 5, (5, 3)):
            np.testing.assert_array_equal(DO.doc_order(n, seed, 0, n), ref_order(n, seed))
    np.testing.assert_array_equal(DO.doc_order(1000, 9, 100, 130), ref_order(1000, 9)[100:130])


def test_deterministic_per_seed_and_different_across_seeds(tmp_path):
    docs = _corpus(0, 2000)
    a = build(tmp_path / "a", docs, shuffle_docs=7)
    b = build(tmp_path / "b", iter(docs), shuffle_docs=7)  # a generator: the same bytes
    c = build(tmp_path / "c", docs, shuffle_docs=8)
    plain = build(tmp_path / "p", docs)
    assert a.fingerprint == b.fingerprint
    assert _docs_of(a) == _docs_of(b)
    assert a.fingerprint != c.fingerprint != plain.fingerprint  # it reflects the stored bytes
    assert _docs_of(a) != _docs_of(c)
    assert _docs_of(plain) == docs and "order" not in plain.meta  # the default keeps the order
    moved = sum(x != y for x, y in zip(_docs_of(a), docs))
    assert moved > 1900  # nearly every document moved


def test_neighbours_are_a_sample_of_the_corpus(tmp_path):
    """A corpus sorted by source (10 sources of 500 documents each): after the shuffle, every
    block of 100 neighbouring documents holds documents of most sources."""
    docs = [[src] * 3 for src in range(10) for _ in range(500)]
    store = build(tmp_path / "s", docs, shuffle_docs=1)
    sources = np.array([store[j][0] for j in range(len(store))])
    per_block = [len(set(sources[k : k + 100].tolist())) for k in range(0, 5000, 100)]
    assert min(per_block) >= 7


def test_tuple_seed_is_the_part_key(tmp_path):
    docs = _corpus(1, 300)
    store = build(tmp_path / "s", docs, shuffle_docs=(4, 2))
    assert _docs_of(store) == [docs[i] for i in ref_order(300, (4, 2))]
    assert store.meta["order"]["seed"] == [4, 2]


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_each_document_keeps_its_loss_mask(tmp_path, backend):
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 500, size=int(n)) for n in rng.integers(0, 40, size=120)]
    masks = [rng.integers(0, 2, size=d.size).astype(np.uint8) for d in docs]
    store = build(
        tmp_path / "s",
        [{"input_ids": d, "loss_mask": m} for d, m in zip(docs, masks)],
        backend=backend,
        shuffle_docs=5,
        fsync=False,
    )
    order = DO.doc_order(len(docs), 5, 0, len(docs))
    assert store.has_loss_mask and len(store.loss_mask) == len(docs)
    for j, i in enumerate(order.tolist()):
        assert store[j].tolist() == docs[i].tolist()
        assert store.loss_mask[j].tolist() == masks[i].tolist()
    store.verify()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temporary store left


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_backends_dtypes_long_and_empty_documents(tmp_path, backend):
    docs = [[]] * 5 + _corpus(2, 200) + [list(range(5000))] + [[2**40, 1]] + [[]]
    store = build(tmp_path / "s", docs, backend=backend, shuffle_docs=3, buffer_tokens=64)
    assert store.backend == backend and store.dtype == np.uint64  # widened as a plain build
    assert _docs_of(store) == [docs[i] for i in ref_order(len(docs), 3)]
    store.verify()
    assert os.listdir(tmp_path) == ["s"]
    small = build(tmp_path / "u16", [[1, 2], [65535]], dtype=np.uint16, shuffle_docs=0)
    assert small.dtype == np.uint16 and len(small) == 2


def test_writer_add_batch_and_attached_files(tmp_path):
    with StoreWriter(tmp_path / "s", shuffle_docs=11) as w:
        w.add_batch(np.arange(10, dtype=np.uint16), np.array([3, 0, 7]))
        w.add([9, 9])
        w.attach("notes.txt", b"hello")
        w.extra["mine"] = {"k": 1}
    docs = [[0, 1, 2], [], [3, 4, 5, 6, 7, 8, 9], [9, 9]]
    assert _docs_of(w.store) == [docs[i] for i in ref_order(4, 11)]
    assert w.store.read_attached("notes.txt") == b"hello" and w.store.meta["mine"] == {"k": 1}
    assert sorted(os.listdir(tmp_path / "s")) == sorted(
        ["mmpack.json", "tokens.bin", "offsets.bin", "notes.txt"]
    )


def test_url_target(tmp_path):
    docs = _corpus(3, 100)
    store = build(f"file://{tmp_path}/remote", docs, shuffle_docs=2)
    assert _docs_of(store) == [docs[i] for i in ref_order(100, 2)]
    assert store.meta["order"]["seed"] == 2


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (-1, ValueError, r"shuffle_docs must be made of ints in \[0, 2\*\*64\), got -1"),
        (2**64, ValueError, "got 18446744073709551616"),
        ("7", TypeError, "shuffle_docs must be an integer, got str '7'"),
        (1.5, TypeError, "shuffle_docs must be an integer, got float 1.5"),
        (True, TypeError, "shuffle_docs must be an integer, got bool True"),
        ((1, -2), ValueError, r"got \(1, -2\)"),
    ],
)
def test_bad_seed_is_refused_before_anything_is_written(tmp_path, seed, error, message):
    with pytest.raises(error, match=message):
        build(tmp_path / "s", [[1, 2]], shuffle_docs=seed)
    with pytest.raises(error, match=message):
        ingest(["x.txt"], tmp_path / "t", shuffle_docs=seed)
    assert os.listdir(tmp_path) == []


# -- failures leave nothing -----------------------------------------------------------------------


def test_bad_document_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="document 30 has a negative token -1"):
        build(tmp_path / "s", [[1, 2]] * 30 + [[3, -1]], shuffle_docs=1, buffer_tokens=3)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failure_during_the_shuffle_pass_leaves_nothing(tmp_path, monkeypatch, error):
    real, calls = DO.write_in_order, []

    def failing(src, add, seed, budget):
        def add_then_fail(docs):
            add(docs)
            calls.append(len(docs))
            raise error("failed mid-shuffle")

        real(src, add_then_fail, seed, budget)

    monkeypatch.setattr(DO, "write_in_order", failing)
    build(tmp_path / "s", _corpus(4, 50))  # an existing store, replaced only by a success
    with pytest.raises(error, match="failed mid-shuffle"):
        build(tmp_path / "s", _corpus(4, 500), shuffle_docs=1, overwrite=True, buffer_tokens=40)
    assert len(calls) == 1  # it failed after the first chunk was written
    assert os.listdir(tmp_path) == ["s"] and len(mmpack.open(tmp_path / "s")) == 50
    with pytest.raises(KeyError):
        with StoreWriter(tmp_path / "w", shuffle_docs=2) as w:
            w.add([1, 2, 3])
            raise KeyError("user code failed")
    assert os.listdir(tmp_path) == ["s"]


_KILLED_BUILD = """
import sys, time
import numpy as np
import mmpack, mmpack._src.store.doc_order as D
real = D.write_in_order
def slow(src, add, seed, budget):
    def add_slowly(docs):
        add(docs)
        print("shuffling", flush=True)
        time.sleep(60)
    real(src, add_slowly, seed, budget)
D.write_in_order = slow
mmpack.build(sys.argv[1], [[k % 200] * 5 for k in range(3000)], shuffle_docs=3, buffer_tokens=400)
"""


def test_killed_shuffled_build_leaves_nothing_that_opens(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, str(tmp_path / "s")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "shuffling\n"
        tmp = [e for e in os.listdir(tmp_path) if e.startswith(".s.mmpack-tmp-")]
        assert len(tmp) == 1 and DO.UNSHUFFLED in os.listdir(tmp_path / tmp[0])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (tmp_path / "s").exists()
    with pytest.raises(FileNotFoundError):
        mmpack.open(tmp_path / "s")
    with pytest.raises(mmpack.errors.FormatError):  # the leftover folder is no store
        mmpack.open(tmp_path / tmp[0])
    store = build(tmp_path / "s", [[1], [2]], shuffle_docs=3)  # the next build cleans up
    assert os.listdir(tmp_path) == ["s"] and len(store) == 2


# -- ingest and the CLI ---------------------------------------------------------------------------


def _texts(root, n=40):
    root.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"document {k} " + "x" * (k % 13)}) for k in range(n)]
    (root / "a.jsonl").write_text("\n".join(lines[: n // 2]) + "\n")
    (root / "b.jsonl").write_text("\n".join(lines[n // 2 :]) + "\n")
    return [str(root / "a.jsonl"), str(root / "b.jsonl")]


def test_ingest_shuffles_and_keeps_its_provenance_true(tmp_path):
    inputs = _texts(tmp_path / "in")
    plain = ingest(inputs, tmp_path / "plain")
    shuffled = ingest(inputs, tmp_path / "shuffled", shuffle_docs=5)
    ref = _docs_of(plain.store)
    assert _docs_of(shuffled.store) == [ref[i] for i in ref_order(len(ref), 5)]
    a, b = plain.store.meta["provenance"], shuffled.store.meta["provenance"]
    for key in ("inputs", "docs_read", "docs_written", "docs_skipped", "tokens_written"):
        assert a[key] == b[key]  # they describe the inputs, which did not change
    assert shuffled.store.meta["order"]["seed"] == 5 and "order" not in plain.store.meta
    assert shuffled.store.meta["tokenizer"] == plain.store.meta["tokenizer"]


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "mmpack", *map(str, args)], capture_output=True, text=True
    )


def test_cli_flag_and_info(tmp_path):
    inputs = _texts(tmp_path / "in")
    res = _cli("build", *inputs, "-o", tmp_path / "s", "--shuffle-docs", "9")
    assert res.returncode == 0, res.stderr
    ref = ingest(inputs, tmp_path / "ref").store
    got = mmpack.open(tmp_path / "s")
    assert _docs_of(got) == [_docs_of(ref)[i] for i in ref_order(len(ref), 9)]
    info = _cli("info", tmp_path / "s")
    assert "order        documents in a keyed random order (--shuffle-docs 9)" in info.stdout
    data = json.loads(_cli("info", tmp_path / "s", "--json").stdout)
    assert data["order"]["seed"] == 9
    assert "order" not in _cli("info", tmp_path / "ref").stdout.split("doc length")[0]


def test_cli_flag_with_the_serial_engine(tmp_path):
    inputs = _parts_inputs(tmp_path / "in")
    res = _cli(
        "build", *inputs, "-o", tmp_path / "s", "--engine", "serial", "--part-mb", "1",
        "--shuffle-docs", "4",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = _docs_of(mmpack.open(tmp_path / "s"))
    ref = _docs_of(ingest(inputs, tmp_path / "ref").store)
    assert sorted(map(tuple, got)) == sorted(map(tuple, ref))
    assert "parts in a keyed order (--shuffle-docs 4)" in _cli("info", tmp_path / "s").stdout


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "argument --shuffle-docs: expected an integer seed >= 0, got -1"),
        ("x", "argument --shuffle-docs: expected an integer seed, got 'x'"),
        ("1.5", "argument --shuffle-docs: expected an integer seed, got '1.5'"),
        (str(2**64), "argument --shuffle-docs: expected an integer seed <= 18446744073709551615"),
    ],
)
def test_cli_bad_seed_is_one_line(tmp_path, value, message):
    (tmp_path / "a.txt").write_text("text")
    res = _cli("build", tmp_path / "a.txt", "-o", tmp_path / "s", "--shuffle-docs", value)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mmpack build: error: ") and message in last
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


# -- distributed builds ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    import dask.distributed as distributed

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as c:
        yield c


def _parts_inputs(root):
    root.mkdir(parents=True, exist_ok=True)
    for k in range(5):
        lines = [json.dumps({"text": f"part {k} doc {j} " + "y" * j}) for j in range(30 + k)]
        (root / f"shard-{k}.jsonl").write_text("\n".join(lines) + "\n")
    return [str(root / "shard-*.jsonl")]


@pytest.mark.dask
def test_dask_build_is_a_deterministic_permutation(tmp_path, cluster):
    from mmpack.ingest import build_distributed, plan_tasks

    inputs = _parts_inputs(tmp_path / "in")
    ref = _docs_of(ingest(inputs, tmp_path / "ref").store)
    runs = []
    for name, engine in (("d1", "dask"), ("d2", "dask"), ("serial", "serial")):
        extra = {"scheduler": cluster.scheduler_address} if engine == "dask" else {}
        rep = build_distributed(
            inputs, tmp_path / name, engine=engine, part_bytes=1, shuffle_docs=6, **extra
        )
        runs.append(rep.store)
    got = _docs_of(runs[0])
    assert sorted(map(tuple, got)) == sorted(map(tuple, ref)) and got != ref
    assert _docs_of(runs[1]) == got and _docs_of(runs[2]) == got  # any engine, any run
    # Each part keyed by (seed, task index), the parts joined in the keyed order of the seed.
    tasks = plan_tasks(inputs, part_bytes=1)
    parts_order = ref_order(len(tasks), 6)
    assert runs[0].part_locations == [f"parts/part-{k:05d}" for k in parts_order]
    expected = []
    for k in parts_order:
        part = _docs_of(ingest(tasks[k], tmp_path / f"p{k}").store)
        expected += [part[i] for i in ref_order(len(part), (6, k))]
    assert got == expected
    order = runs[0].meta["order"]
    assert order["parts"] == "keyed" and order["part_count"] == 5 and order["seed"] == 6
    info = _cli("info", tmp_path / "d1")
    assert "documents keyed within each of 5 parts" in info.stdout
    assert sorted(e for e in os.listdir(tmp_path) if e.startswith(".")) == []
