"""The data schedule: deterministic per seed, disjoint shards per rank, one permutation per epoch, direct resume."""

import numpy as np
import pytest

from training_assets.trainers.loop import DataSchedule


def _epoch(schedule, epoch):
    return [schedule.indices(epoch * schedule.per_epoch + g) for g in range(schedule.per_epoch)]


def test_same_seed_same_order_other_seed_other_order():
    a, b, c = (DataSchedule(103, 4, seed) for seed in (7, 7, 8))
    assert [a.indices(p) for p in range(60)] == [b.indices(p) for p in range(60)]
    assert [a.indices(p) for p in range(26)] != [c.indices(p) for p in range(26)]
    assert _epoch(a, 0) != _epoch(a, 1)  # each epoch is shuffled anew


def test_one_process_sees_every_example_once_per_epoch():
    s = DataSchedule(103, 4, seed=1)
    for epoch in range(3):
        rows = [i for batch in _epoch(s, epoch) for i in batch]
        assert sorted(rows) == list(range(103))  # the last micro-batch is partial (103 = 25·4 + 3)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_disjoint_shards_of_the_same_global_batches(world):
    n, batch = 100, 4
    ranks = [DataSchedule(n, batch, seed=5, world_size=world, rank=r) for r in range(world)]
    per_epoch = ranks[0].per_epoch
    assert per_epoch == n // (batch * world)
    for epoch in range(2):
        seen = []
        for g in range(per_epoch):
            shards = [set(s.indices(epoch * per_epoch + g)) for s in ranks]
            assert all(len(x) == batch for x in shards)
            assert len(set().union(*shards)) == batch * world  # disjoint
            seen += [i for x in shards for i in x]
        assert len(seen) == len(set(seen)) == per_epoch * batch * world  # no row twice in an epoch
    one = DataSchedule(n, batch * world, seed=5)  # the ranks together take one process's global batch
    assert [sorted(one.indices(g)) for g in range(per_epoch)] == [
        sorted(i for s in ranks for i in s.indices(g)) for g in range(per_epoch)]


def test_resume_from_a_position_continues_without_replaying(monkeypatch):
    draws = []
    real = np.random.default_rng

    def counting_rng(seed):
        draws.append(tuple(seed))
        return real(seed)

    monkeypatch.setattr(np.random, "default_rng", counting_rng)
    straight = DataSchedule(50, 4, seed=2)
    expected = [straight.indices(p) for p in range(40)]  # 13 micro-batches per epoch: epochs 0, 1, 2, 3
    assert draws == [(2, 0), (2, 1), (2, 2), (2, 3)]  # one permutation per epoch, not per micro-batch
    draws.clear()
    resumed = DataSchedule(50, 4, seed=2)  # a fresh process resuming at data position 30 (epoch 2)
    assert [resumed.indices(p) for p in range(30, 40)] == expected[30:]
    assert draws == [(2, 2), (2, 3)]  # straight to the saved position: earlier epochs are never drawn


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="no examples"):
        DataSchedule(0, 4, seed=0)
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        DataSchedule(5, 4, seed=0, world_size=2, rank=0)
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        DataSchedule(50, 4, seed=0, world_size=2, rank=2)
