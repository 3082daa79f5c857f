"""build_region_plan (mmpack._src.ingest.region_plan): a plan's regions built on a Dask
LocalCluster on 127.0.0.1 give the serial plan file, which the packed view then opens."""

from __future__ import annotations

import numpy as np
import pytest
from _plans import same_plan

from mmpack import PackedDataset, build
from mmpack.ingest import build_region_plan
from mmpack.packing import build_plan


@pytest.mark.dask
def test_regions_built_on_a_dask_local_cluster_give_the_serial_plan(tmp_path):
    import dask.distributed as distributed

    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 1000, int(n)) for n in rng.lognormal(4, 1, 3000).astype(int)]
    store = build(tmp_path / "s", docs)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        plan = build_region_plan(
            store,
            128,
            add_eot=True,
            region_tokens=5000,
            regions_per_task=3,
            scheduler=cluster.scheduler_address,
        )
    assert plan.n_regions > 20
    want = build_plan(store.doc_lens, 128, add_eot=True, region_tokens=5000)
    assert same_plan(plan, want)
    ds = PackedDataset(store, 128, eot=0, region_tokens=5000)  # opens the file the cluster built
    assert same_plan(ds.plan, want) and ds.plan.bin_ptr.base is not None
    with pytest.raises(ValueError, match="engine must be one of"):
        build_region_plan(store, 128, add_eot=True, engine="spark")
