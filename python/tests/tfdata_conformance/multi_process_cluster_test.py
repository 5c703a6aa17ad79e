# Copyright 2021 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# Ported to Sluice and modified: tensorflow/python/data/experimental/kernel_tests/service/
# multi_process_cluster_test.py, against Sluice's Python API (local workers run in this
# process, remote ones in a helper process; reads with deadlines).
"""Ports of tf.data service's multi-process cluster test (``MultiProcessClusterTest``): the
local and remote workers run and produce data."""

from __future__ import annotations

import pytest

from tfdata_conformance._cluster import (
    MultiProcessCluster,
    assert_dataset_produces,
    make_distributed_range_dataset,
)


@pytest.mark.parametrize("num_remote_workers", [0, 1, 3])
@pytest.mark.parametrize("num_local_workers", [0, 1, 3])
def testCluster(num_local_workers, num_remote_workers):
    """Ports MultiProcessClusterTest.testCluster."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    num_workers = num_local_workers + num_remote_workers
    if num_workers == 0:
        return
    dataset = make_distributed_range_dataset(num_elements, cluster)
    assert_dataset_produces(
        dataset, num_workers * list(range(num_elements)), assert_items_equal=True
    )
