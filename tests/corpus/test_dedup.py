"""dedup: exact and near duplicates, clusters, the representative rule, determinism, both methods."""

import itertools
import random

import pytest

from training_assets_kernels import reference as R
from training_assets.data_engine import dedup, lsh_params
from training_assets.data_engine.dedup import collision_probability, row_agreement

VOCAB = [f"w{i}" for i in range(400)]


def _corpus(n=120, seed=0):
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(VOCAB) for _ in range(80)) for _ in range(n)]
    for i in range(0, n, 10):  # near copies: 1-4 words replaced
        words = docs[i].split()
        for pos in rng.sample(range(len(words)), rng.randint(1, 4)):
            words[pos] = "edited"
        docs.append(" ".join(words))
    docs.append(docs[3])  # an exact copy
    return [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)]


def test_finds_every_pair_above_threshold_and_no_pair_below():
    records = _corpus()
    sets = [R.shingle_set(r["text"].encode(), 5) for r in records]
    truth = {(a, b) for a, b in itertools.combinations(range(len(records)), 2) if R.jaccard(sets[a], sets[b]) >= 0.8}
    result = dedup(records)
    found = {(min(int(a[1:]), int(b[1:])), max(int(a[1:]), int(b[1:]))) for a, b, _ in result.pairs}
    exact_copy = (3, len(records) - 1)  # removed by content before the near-dup stage
    assert found == truth - {exact_copy}
    assert all(s >= 0.8 for _, _, s in result.pairs)


def test_representative_is_the_first_record_and_clusters_cover_every_record():
    records = _corpus()
    result = dedup(records)
    first = [r["id"] for r in records]
    for rep, members in result.clusters.items():
        assert members[0] == rep and min(members, key=first.index) == rep
    assert sorted(m for ms in result.clusters.values() for m in ms) == sorted(first)
    assert [r["id"] for r in result.kept] == [i for i in first if i in result.clusters]
    reasons = {d.id: d for d in result.dropped}
    assert reasons[f"d{len(records) - 1}"].reason == "exact_duplicate"
    assert reasons[f"d{len(records) - 1}"].duplicate_of == "d3"
    near = [d for d in result.dropped if d.reason == "near_duplicate"]
    assert near and all(d.duplicate_of in result.clusters and d.similarity >= 0.8 for d in near)
    assert result.stats["kept"] + len(result.dropped) == len(records)


def test_reordering_input_changes_only_which_copy_is_kept():
    records = _corpus()
    a = dedup(records)
    b = dedup(list(reversed(records)))
    assert len(a.kept) == len(b.kept)
    assert sorted(map(sorted, a.clusters.values())) == sorted(map(sorted, b.clusters.values()))


@pytest.mark.parametrize("method", ["minhash", "cosine"])
def test_same_input_and_seed_give_the_same_result(method):
    records = _corpus(seed=3)
    one, two = dedup(records, method=method, seed=7), dedup(records, method=method, seed=7)
    assert one.clusters == two.clusters and one.stats == two.stats
    assert [d.to_dict() for d in one.dropped] == [d.to_dict() for d in two.dropped]


def test_cosine_method_groups_reworded_copies():
    base = "the quick brown fox jumps over the lazy dog while the cat sleeps on a warm mat near the door"
    shuffled = " ".join(reversed(base.split()))  # same words, different order: cosine 1, Jaccard ~0
    records = [{"id": "a", "text": base}, {"id": "b", "text": shuffled},
               {"id": "c", "text": "an unrelated sentence about tax forms and quarterly filing deadlines"}]
    assert dedup(records, method="cosine", threshold=0.9).clusters == {"a": ["a", "b"], "c": ["c"]}
    assert dedup(records, method="minhash").clusters == {"a": ["a"], "b": ["b"], "c": ["c"]}


def test_lsh_params_meet_the_recall_target_at_the_threshold():
    for threshold in (0.5, 0.7, 0.8, 0.9):
        bands, rows = lsh_params(threshold, 128)
        assert bands * rows <= 128
        assert collision_probability(threshold, bands, rows) >= 0.995
        assert collision_probability(threshold, bands, rows + 1) < 0.995 or bands * (rows + 1) > 128
    bands, rows = lsh_params(0.8, 128, method="cosine")
    assert collision_probability(row_agreement(0.8, "cosine"), bands, rows) >= 0.995


def test_empty_and_short_texts_are_not_clustered_with_everything():
    records = [{"id": "e1", "text": ""}, {"id": "e2", "text": "   "}, {"id": "s", "text": "hello"},
               {"id": "s2", "text": "hello"}]
    result = dedup(records)
    # "" and "   " differ as text and have no shingles: neither an exact nor a near copy
    assert result.clusters == {"e1": ["e1"], "e2": ["e2"], "s": ["s", "s2"]}
    assert result.stats["empty_documents"] == 2


def test_bad_input_is_refused_with_the_cause():
    with pytest.raises(ValueError, match="'x' appears more than once"):
        dedup([{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
    with pytest.raises(ValueError, match="method 'simhash'"):
        dedup([], method="simhash")


def test_chunked_pass_gives_the_one_buffer_features_and_roots(monkeypatch):
    """The in-memory path packs and sketches chunk by chunk; with chunks of a few texts it must give
    the same signatures, roots and result as one packed buffer, and a hash collision (every hash
    forced equal) must never merge different texts."""
    import importlib

    import numpy as np

    from training_assets_kernels import dedup as K

    module = importlib.import_module("training_assets.data_engine.dedup")  # the package re-exports the function

    records = _corpus(60)
    records.append(dict(records[20], id="exact-copy"))
    texts = [r["text"] for r in records]
    params = module.DedupParams("minhash", 0.8, 128, 5, module.DEFAULT_SEED, 0.995)
    data, offsets = module.pack_texts(texts)
    whole = module.packed_features(data, offsets, params)
    expected = dedup(records)
    monkeypatch.setattr(module, "PACK_CHUNK", 700)  # a text or two per chunk
    assert len(list(module._text_chunks(texts))) > len(texts) // 3
    hashes, signatures, counts = module.streamed_minhash(texts, params)
    np.testing.assert_array_equal(signatures, whole.signatures)
    np.testing.assert_array_equal(hashes, K.content_hashes(data, offsets))
    np.testing.assert_array_equal(module.exact_roots_from_hashes(texts, hashes), K.exact_roots(data, offsets))
    np.testing.assert_array_equal(module.exact_roots_from_hashes(texts, np.zeros(len(texts), np.uint64)),
                                  K.exact_roots(data, offsets))
    rows = np.array([0, 2, 3, 7, 8, 9, 12], np.int64)
    matrix = np.arange(13 * 4).reshape(13, 4)
    np.testing.assert_array_equal(module._keep_rows(matrix.copy(), rows, block=3), matrix[rows])  # in place
    np.testing.assert_array_equal(module._keep_rows(matrix.copy(), rows[::3], block=3), matrix[rows[::3]])  # a copy
    chunked = dedup(records)
    kept = [r["id"] for r in chunked.kept]
    assert (kept, chunked.clusters, chunked.pairs, chunked.dropped) == (
        [r["id"] for r in expected.kept], expected.clusters, expected.pairs, expected.dropped)
    assert "exact-copy" not in kept and "exact-copy" in chunked.clusters[records[20]["id"]]
