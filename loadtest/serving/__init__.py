"""Serving load through the proxy: `pdspec bench` and its stacks, the HTTP load tools, the soak, hostile clients, the hand-off probe and the DP-vote reader."""
