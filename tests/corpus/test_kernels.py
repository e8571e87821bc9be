"""Each Numba kernel against its plain twin in kernels/reference.py, on awkward inputs."""

import random

import numpy as np
import pytest

from training_assets_kernels import dedup as K
from training_assets_kernels import reference as R
from training_assets.data_engine.dedup import pack_texts

WORDS = ["alpha", "Beta", "GAMMA", "délta", "ε", "日本語", "x", "42", "a-b", "naïve", "the", "The"]


def _docs(n=60, seed=0):
    rng = random.Random(seed)
    docs = ["", "   ", "one", "two words", "tab\tseparated\nlines\r\nhere", "\u00e9t\u00e9 caf\u00e9 CAFÉ café"]
    for _ in range(n):
        k = rng.choice([1, 3, 4, 5, 6, 9, 20, 60])
        docs.append(rng.choice([" ", "  ", "\n", " \t "]).join(rng.choice(WORDS) for _ in range(k)))
    return docs


@pytest.fixture(scope="module")
def packed():
    docs = _docs()
    data, offsets = pack_texts(docs)
    return docs, [d.encode() for d in docs], data, offsets


@pytest.mark.parametrize("ngram", [1, 3, 5, 13])
def test_shingle_hashes_match_reference(packed, ngram):
    _, raw, data, offsets = packed
    got_offsets, got = K.shingle_hashes(data, offsets, ngram)
    want_offsets, want = R.shingle_hashes(raw, ngram)
    np.testing.assert_array_equal(got_offsets, want_offsets)
    np.testing.assert_array_equal(got, want)


def test_ascii_case_folds_but_other_scripts_do_not(packed):
    data, offsets = pack_texts(["The CAT sat", "the cat SAT", "ÉTÉ", "été"])
    o, h = K.shingle_hashes(data, offsets, 5)
    assert h[o[0]:o[1]].tolist() == h[o[1]:o[2]].tolist()
    assert h[o[2]:o[3]].tolist() != h[o[3]:o[4]].tolist()  # non-ASCII case is normalize's business


def test_minhash_and_band_keys_match_reference(packed):
    _, raw, data, offsets = packed
    o, h = K.shingle_hashes(data, offsets, 3)
    sig = K.minhash_signatures(o, h, 16, K.oph_salt(7))
    sets = [R.shingle_set(d, 3) for d in raw]
    np.testing.assert_array_equal(sig, R.minhash_signatures(sets, 16, 7))
    assert (sig[0] == 0xFFFFFFFF).all()  # the empty document
    np.testing.assert_array_equal(K.band_keys(sig, 4, 4), R.band_keys(sig, 4, 4))


def test_lsh_candidates_jaccard_and_union_find_match_reference(packed):
    _, raw, data, offsets = packed
    o, h = K.shingle_hashes(data, offsets, 1)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 6, size=(len(raw), 3)).astype(np.uint64)
    nonempty = rng.random(len(raw)) < 0.8
    pairs = K.lsh_candidates(keys, nonempty)
    assert [tuple(p) for p in pairs.tolist()] == R.lsh_candidates(keys, nonempty)
    sets = [R.shingle_set(d, 1) for d in raw]
    want = np.array([R.jaccard(sets[a], sets[b]) for a, b in pairs.tolist()])
    np.testing.assert_allclose(K.jaccard_pairs(pairs, o[:-1], o[1:], h, 0.0), want)
    # with a floor: exact at or above it, below it otherwise (the merge may stop early)
    floored = K.jaccard_pairs(pairs, o[:-1], o[1:], h, 0.5)
    np.testing.assert_allclose(floored[want >= 0.5], want[want >= 0.5])
    assert (floored[want < 0.5] < 0.5).all() and (floored >= want - 1e-12).all()
    edges = pairs[::3]
    np.testing.assert_array_equal(K.union_find(len(raw), edges), R.union_find(len(raw), [tuple(e) for e in edges.tolist()]))


def test_hashed_features_hyperplanes_and_cosine_match_reference(packed):
    _, raw, data, offsets = packed
    fo, ids, w = K.hashed_features(data, offsets, 1 << 10)
    vectors = R.hashed_features(raw, 1 << 10)
    for d, vec in enumerate(vectors):
        assert ids[fo[d]:fo[d + 1]].tolist() == list(vec)
        np.testing.assert_allclose(w[fo[d]:fo[d + 1]], list(vec.values()), rtol=1e-6)
    bits = K.hyperplane_signatures(fo, ids, w, 32, 3)
    np.testing.assert_array_equal(bits, R.hyperplane_signatures(vectors, 32, 3))
    pairs = np.array([(a, b) for a in range(0, 30, 3) for b in range(a + 1, 30, 7)], np.int64)
    np.testing.assert_allclose(K.cosine_pairs(pairs, fo, ids, w), [R.cosine(vectors[a], vectors[b]) for a, b in pairs.tolist()],
                               rtol=1e-5, atol=1e-6)


def test_contains_any_matches_reference(packed):
    _, raw, data, offsets = packed
    o, h = K.shingle_hashes(data, offsets, 2)
    sets = [R.shingle_set(d, 2) for d in raw]
    index = np.unique(np.array(sorted(sets[10] | sets[20]), np.uint64))
    found = K.contains_any(o, h, index)
    assert (found >= 0).tolist() == R.contains_any(sets, set(index.tolist()))


def test_fused_signatures_equal_two_step_and_sorting_only_touches_the_listed_documents(packed):
    _, raw, data, offsets = packed
    o, h = K.shingle_hashes(data, offsets, 5)
    raw_offsets, raw_hashes, fused = K.shingle_signatures(data, offsets, 5, 32, K.oph_salt(1))
    np.testing.assert_array_equal(fused, K.minhash_signatures(o, h, 32, K.oph_salt(1)))
    before = raw_hashes.copy()
    docs = np.array([3, 7, 8, 40], np.int64)
    ends = K.sort_unique_blocks(raw_offsets, raw_hashes, docs)
    for d in range(len(raw)):
        block = raw_hashes[raw_offsets[d]:ends[d]].tolist()
        if d in docs:
            assert block == sorted(R.shingle_set(raw[d], 5))
        else:  # untouched: still every shingle in text order
            assert block == before[raw_offsets[d]:raw_offsets[d + 1]].tolist()


@pytest.mark.parametrize("ngram", [1, 3, 5, 13])
def test_streamed_sketch_is_bit_identical_to_signatures_of_the_stored_shingles(packed, ngram):
    """minhash_sketch rolls the shingle hash over a ring of word hashes and never stores a
    shingle; its signatures and shingle counts must equal the two-step kernels' exactly."""
    _, raw, data, offsets = packed
    o, h = K.shingle_hashes(data, offsets, ngram)
    raw_offsets, _, _ = K.shingle_signatures(data, offsets, ngram, 32, K.oph_salt(3))
    sig, counts = K.minhash_sketch(data, offsets, ngram, 32, K.oph_salt(3))
    np.testing.assert_array_equal(sig, K.minhash_signatures(o, h, 32, K.oph_salt(3)))
    np.testing.assert_array_equal(counts, np.diff(raw_offsets))
    assert (counts == 0).tolist() == [not d.split() for d in raw]


def test_minhash_agreement_is_an_unbiased_jaccard_estimate_even_for_small_sets():
    """Densified one-permutation hashing: P(bin agrees) = Jaccard, also when most bins are empty."""
    rng = np.random.default_rng(5)
    universe = rng.integers(0, 2**63, size=60, dtype=np.uint64)
    for size, shared in ((12, 8), (40, 30)):  # 12 shingles in 64 bins: most bins borrow
        a, b = universe[:size], np.concatenate([universe[:shared], universe[size:2 * size - shared]])
        jaccard = shared / (2 * size - shared)
        offsets = np.array([0, size, 2 * size], np.int64)
        hashes = np.concatenate([a, b])
        agreement = [np.mean(sig[0] == sig[1]) for sig in
                     (K.minhash_signatures(offsets, hashes, 64, K.oph_salt(seed)) for seed in range(300))]
        assert abs(np.mean(agreement) - jaccard) < 0.015, (size, shared, np.mean(agreement), jaccard)


def test_signature_agreement_matches_reference():
    rng = np.random.default_rng(2)
    sigs = rng.integers(0, 3, size=(20, 64)).astype(np.uint32)
    pairs = np.array([(i, j) for i in range(20) for j in range(i + 1, 20, 3)], np.int64)
    np.testing.assert_allclose(K.signature_agreement(pairs, sigs), R.signature_agreement(pairs, sigs))


def test_content_hashes_and_exact_roots_match_reference(packed):
    docs, raw, data, offsets = packed
    docs2 = docs + docs[3:9] + ["one", "", "tab\tseparated\nlines\r\nhere"]
    raw2 = [d.encode() for d in docs2]
    data2, offsets2 = pack_texts(docs2)
    np.testing.assert_array_equal(K.content_hashes(data2, offsets2),
                                  np.array([R.content_hash(d) for d in raw2], np.uint64))
    roots = K.exact_roots(data2, offsets2)
    np.testing.assert_array_equal(roots, R.exact_roots(raw2))
    assert (roots != np.arange(len(docs2))).sum() >= 9  # the appended copies point back


def test_exact_roots_map_equal_bytes_to_the_first_occurrence_only():
    # same lengths, different bytes: only byte-equal texts share a root, the first occurrence
    docs = ["ab" * 20, "ba" * 20, "ab" * 20, "a" * 40, "ba" * 20]
    data, offsets = pack_texts(docs)
    np.testing.assert_array_equal(K.exact_roots(data, offsets), [0, 1, 0, 3, 1])


@pytest.mark.parametrize("docs", [["plain ascii", "", "more ascii text"], ["ascii", "café ☕", "", "日本語 x"]])
def test_pack_texts_gives_each_documents_utf8_bytes(docs):
    data, offsets = pack_texts(docs)
    assert [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(docs))] == [d.encode() for d in docs]


def test_the_unaligned_load_refuses_a_strided_or_wider_buffer():
    """``content_hashes`` reads 8 bytes at a time from the buffer's own memory: a view with strides
    (or of another dtype) is a typing error, not wrong bytes hashed."""
    import numba

    data, offsets = pack_texts(["abcdefgh" * 4, "xyz"])
    with pytest.raises(numba.core.errors.TypingError, match="_load_u64"):
        K.content_hashes(np.repeat(data, 2)[::2], offsets)
    with pytest.raises(numba.core.errors.TypingError, match="_load_u64"):
        K.content_hashes(data.astype(np.int16), offsets)
