"""The restart policy of `pdspec up`: backoff that doubles within the window, a bound on
exits, a window that forgets, and fail-fast."""

from pdspec.restarts import MAX_BACKOFF_S, RestartPolicy


def test_backoff_doubles_then_gives_up():
    policy = RestartPolicy(max_restarts=3, window_s=100, backoff_s=1)
    assert [policy.after_exit("decode", t) for t in (0, 1, 2)] == [1, 2, 4]
    assert policy.after_exit("decode", 3) is None  # a fourth exit within 100 s
    assert policy.after_exit("prefill", 3) == 1  # children are counted apart


def test_old_exits_leave_the_window():
    policy = RestartPolicy(max_restarts=1, window_s=10, backoff_s=2)
    assert policy.after_exit("proxy", 0) == 2
    assert policy.after_exit("proxy", 11) == 2  # the first one is out of the window
    assert policy.exits_in_window("proxy") == 1


def test_backoff_is_capped_and_never_means_fail_fast():
    policy = RestartPolicy(max_restarts=100, window_s=1e9, backoff_s=1)
    assert max(policy.after_exit("w", t) for t in range(20)) == MAX_BACKOFF_S
    assert RestartPolicy(enabled=False).after_exit("w", 0) is None
