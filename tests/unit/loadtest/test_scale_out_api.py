"""The scale-out API measurement's workload and table."""

from loadtest.micro.scale_out_api import chats, markdown


def test_chats_are_seeded_and_sized():
    assert chats(3, 50, seed=1) == chats(3, 50, seed=1) != chats(3, 50, seed=2)
    assert all(len(chat[1]["content"].split()) == 50 and chat[0]["role"] == "system" for chat in chats(3, 50, 1))


def test_table_names_every_call_and_the_agreement():
    ms = {name: {"median": 1.0, "p90": 2.0} for name in ("tokenize", "render", "chat", "generate")}
    report = {
        "command": "c",
        "prompts": 4,
        "prompt_tokens_median": 100,
        "max_tokens": 8,
        "ids_agree": 4,
        "outputs_agree": 3,
        "ms": ms,
        "answer_fields": {"chat": ["choices"], "generate": ["choices"], "generate_choice": ["token_ids"]},
    }
    table = markdown(report)
    assert "prompt ids agree 4/4, output tokens agree 3/4" in table
    assert all(f"| {name} | 1.0 | 2.0 |" in table for name in ms)
