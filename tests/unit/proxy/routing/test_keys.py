"""The rendezvous keys a prompt is routed by (proxy/routing/keys.py)."""

from proxy.routing import registry
from proxy.routing.keys import affinity_key, new_part_key, rendezvous_key, token_affinity_key
from proxy.routing.kv_index import block_keys


def test_affinity_key_reads_prompts_and_chats():
    assert affinity_key({"prompt": "abc"}) == "abc"
    assert affinity_key({"prompt": [[1, 2], [3]]}) == "[1, 2]"
    assert affinity_key({"messages": [{"role": "user", "content": "x"}]}).startswith("[{")
    assert affinity_key({}) is None


def test_the_rendezvous_key_is_the_first_block_no_worker_holds():
    ids = list(range(100, 120))
    keys = block_keys(ids, 4)
    assert new_part_key(ids, keys, 4) == keys[0].hex()  # nothing held anywhere
    assert new_part_key(ids, keys, 4, {"p0": 8, "p1": 4}, {"d0": 0}) == keys[2].hex()  # most held: 2 blocks
    assert new_part_key(ids, keys, 4, {}, {"d0": 12}) == keys[3].hex()  # either pool counts
    assert new_part_key(ids, keys, 4, {"p0": 20}) == keys[-1].hex()  # all held: the last block
    assert new_part_key(ids[:3], [], 4) == token_affinity_key(ids[:3])  # no full block: the ids
    # Two prompts sharing 3 held blocks and then differing get different keys; held nowhere,
    # they share the key of their common first block.
    other = ids[:12] + [7] * 8
    assert new_part_key(other, block_keys(other, 4), 4, {"p0": 12}) != new_part_key(ids, keys, 4, {"p0": 12})
    assert new_part_key(other, block_keys(other, 4), 4) == new_part_key(ids, keys, 4)


def test_a_kv_aware_pool_breaks_ties_on_the_new_part_and_prefix_affinity_on_the_ids_start():
    assert rendezvous_key(registry.make("kv_aware"), "start", "new") == "new"
    assert rendezvous_key(registry.make("kv_aware"), "start", None) == "start"
    assert rendezvous_key(registry.make("prefix_affinity"), "start", "new") == "start"
