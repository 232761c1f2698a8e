"""proxy/edge/endpoint.py: the request ids the proxy makes up."""

from __future__ import annotations

import os
import re

from proxy.edge.endpoint import RequestIds, request_id_of


def test_new_ids_are_32_hex_digits_and_never_repeat():
    ids = RequestIds()
    made = [ids.next() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in made)
    assert len(set(made)) == len(made)


def test_two_makers_do_not_share_a_prefix():
    assert RequestIds().next()[:16] != RequestIds().next()[:16]


def test_a_forked_child_draws_its_own_prefix():
    ids = RequestIds()
    parent = ids.next()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, ids.next().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert child[:16] != parent[:16]


def test_a_sane_client_id_is_kept_and_an_odd_one_replaced():
    assert request_id_of({"headers": [(b"x-request-id", b"abc-1")]}) == "abc-1"
    for odd in (b"", b"x" * 129, "é".encode(), b"a\tb"):
        made = request_id_of({"headers": [(b"x-request-id", odd)]})
        assert re.fullmatch(r"[0-9a-f]{32}", made), odd
