"""The rendezvous keys a prompt is routed by, and the rendezvous hash that ranks a pool's
workers for a key (prefix_affinity's choice, kv_aware's tie-break).

- `affinity_key`: the start of the prompt (or of the rendered chat) as the body has it;
- `token_affinity_key`: the start of its token ids (cache-aware routing reads them): the
  same for two requests whose prompts render alike, whatever API they came through;
- `new_part_key`: kv_aware's key, the prompt's first block no worker holds;
- `rendezvous_key`: which of the last two a pool's policy routes by.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.routing.policy import Policy

AFFINITY_PREFIX_CHARS = 256
AFFINITY_PREFIX_TOKENS = 64  # about AFFINITY_PREFIX_CHARS of text


def rendezvous(key: str, url: str) -> int:
    """The rank of worker `url` for `key` (highest wins): a key stays on one worker while the
    pool is unchanged, and only the keys of a worker that leaves move."""
    return int.from_bytes(hashlib.blake2b(f"{url}|{key}".encode(), digest_size=8).digest(), "big")


def affinity_key(body: dict) -> str | None:
    """The start of the prompt (or of the rendered chat) as a routing key."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:AFFINITY_PREFIX_CHARS]
    if isinstance(prompt, list) and prompt:
        return repr(prompt[0] if isinstance(prompt[0], list) else prompt)[:AFFINITY_PREFIX_CHARS]
    messages = body.get("messages")
    if isinstance(messages, list):
        return repr(messages)[:AFFINITY_PREFIX_CHARS]
    responses_input = body.get("input")  # the Responses API: rendered after its `instructions`
    if isinstance(responses_input, (str, list)):
        return repr((body.get("instructions"), responses_input))[:AFFINITY_PREFIX_CHARS]
    return None


def token_affinity_key(ids: list[int]) -> str:
    """The start of the prompt's token ids as a routing key (cache-aware routing, which
    reads them): the same for two requests whose prompts render alike, whatever API they
    came through."""
    return repr(ids[:AFFINITY_PREFIX_TOKENS])


def new_part_key(ids: list[int], keys: list[bytes], block_size: int, *cached: dict[str, int]) -> str:
    """A prompt's rendezvous key (kv_aware's tie-break): its first full block that no
    worker holds, by the `cached` tokens of each pool's workers (a chained key, so it names
    the prompt up to there), else its last full block, else its first ids.

    Why not the prompt's start: when the scores tie (every worker holds the same shared
    part, a system prompt, and none is busier), a key on the shared part sends every new
    prefix to the same worker, whose cache then churns while the other's stays cold. Keyed
    on the part nobody holds, new prefixes spread over the pool; a prefix's later requests
    follow its cache (or its routing note) by their scores, not by this key. The key comes
    from token ids, so prompts that render alike meet whatever API they came through."""
    if not keys:
        return token_affinity_key(ids)
    held = max((tokens for pool in cached for tokens in pool.values()), default=0) // block_size
    return keys[min(held, len(keys) - 1)].hex()


def rendezvous_key(policy: Policy, affinity: str | None, new_part: str | None) -> str | None:
    """kv_aware's tie-break key (`new_part`) on a pool whose policy is cache-aware, else the
    ids' start (`affinity`: prefix_affinity keeps a prefix on one worker)."""
    return new_part if policy.cache_aware and new_part is not None else affinity
