"""Coordinated reads, and a three-replica quorum started from Python whose leader is stopped
mid-epoch (with a definition of several MiB registered before)."""

from __future__ import annotations

import threading

import numpy as np
from conftest import wait_until

import sluice
from sluice.data import Dataset


def test_coordinated_reads_go_in_lockstep_rounds(cluster):
    num_consumers, steps = 2, 20
    dataset = Dataset.range(10**9).repeat()
    consumers = [
        iter(
            dataset.apply(
                sluice.distribute(
                    "parallel_epochs",
                    cluster.target,
                    job_name="rounds",
                    consumer_index=i,
                    num_consumers=num_consumers,
                )
            )
        )
        for i in range(num_consumers)
    ]
    results = [[] for _ in consumers]

    def read(i: int) -> None:
        results[i] = [int(next(consumers[i])) for _ in range(steps)]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(num_consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a consumer did not finish its rounds within 60 s"
    for step in range(steps):
        first = results[0][step]
        assert [r[step] for r in results] == [first + c for c in range(num_consumers)], step
        assert first % num_consumers == 0, step


def test_a_three_replica_quorum_survives_its_leader_stopped_mid_epoch(tmp_path):
    # Every replica takes port 0: the first creates the quorum, the others join it at the
    # peer addresses they bound, so no port is picked before its server binds it.
    replicas = [sluice.DispatchServer(sluice.DispatcherConfig(work_dir=str(tmp_path / "r1")))]
    for node_id in (2, 3):
        replicas.append(
            sluice.DispatchServer(
                sluice.DispatcherConfig(
                    node_id=node_id, join=True, work_dir=str(tmp_path / f"r{node_id}")
                )
            )
        )
    service = ",".join(r.target.removeprefix("grpc://") for r in replicas)
    workers = []
    try:
        assert sluice.add_node(replicas[0].target, 2, replicas[1].peer_address) == [1, 2]
        assert sluice.add_node(replicas[0].target, 3, replicas[2].peer_address) == [1, 2, 3]

        def members():
            status = replicas[0].status()
            return sorted((m["id"], m["addr"], m["peer_addr"]) for m in status["members"])

        # Each replica records its own client address; status lists both of each member's.
        want = [
            (r.node_id, r.target.removeprefix("grpc://"), r.peer_address) for r in replicas
        ]
        wait_until(lambda: members() == want, "every member's addresses in status")

        def agreed_leader():
            views = {r.leader_id for r in replicas if r._native.running()}
            return views.pop() if len(views) == 1 and None not in views else None

        wait_until(lambda: agreed_leader() is not None, "the replicas to agree on a leader")
        workers = [sluice.WorkerServer(sluice.WorkerConfig(service)) for _ in range(2)]
        # A 4 MiB definition: the leader replicates it in parts, and it must be whole on the
        # replica that leads next.
        rows = np.arange(2**20, dtype=np.float32).reshape(16, -1)
        rows_id = sluice.register_dataset(service, Dataset.from_tensor_slices(rows))
        n = 3000
        ds = Dataset.range(n).apply(sluice.distribute("distributed_epoch", service))
        it = iter(ds)
        seen = [int(next(it)) for _ in range(n // 3)]
        leader = agreed_leader()
        replicas[leader - 1].stop()
        wait_until(
            lambda: agreed_leader() not in (None, leader), "a new leader among the other two"
        )
        seen.extend(int(x) for x in it)
        assert sorted(seen) == list(range(n)), "every element exactly once"
        read = sluice.from_dataset_id("parallel_epochs", service, rows_id)
        got = sorted(read, key=lambda row: row[0])
        assert len(got) == len(rows) * len(workers)  # every worker reads every row
        for i, row in enumerate(got[:: len(workers)]):
            assert np.array_equal(row, rows[i])
    finally:
        for server in workers + replicas:
            server.stop()
