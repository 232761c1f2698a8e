"""The generation APIs the proxy serves through P/D (completions, chat, responses, messages): one
module per API, holding what differs (validation, legs, usage, stream), and what they share."""
