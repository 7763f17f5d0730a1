"""python -m backend generate, as scripts and checks use it."""
import json
import subprocess
import sys

TINY = "assets/inkling-tiny"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "backend", "generate", "--model", TINY, *args],
                          capture_output=True, text=True, timeout=300)


def test_json_output_for_a_chat_prompt():
    result = run_cli("--prompt", "Once upon a time", "--max-tokens", "6", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt_ids"][0] == 0 and out["prompt_ids"][-1] == 1   # <|message_user|> ... <|message_model|>
    assert len(out["token_ids"]) == 6 and len(out["steps"]) == 6
    assert [t for s in out["steps"] for t in s["emitted"]] == out["token_ids"]
    assert all(s["drafted"] == [] and s["accepted"] == 0 for s in out["steps"])
    assert out["summary"]["tokens_per_s"] > 0 and out["summary"]["ttft_s"] > 0
    assert isinstance(out["text"], str)


def test_prompt_ids_are_fed_raw_and_greedy_is_repeatable():
    first = json.loads(run_cli("--prompt-ids", "4,100,200,300", "--max-tokens", "5", "--json").stdout)
    second = json.loads(run_cli("--prompt-ids", "4,100,200,300", "--max-tokens", "5", "--json").stdout)
    assert first["prompt_ids"] == [4, 100, 200, 300]
    assert first["token_ids"] == second["token_ids"]


def test_bad_input_exits_with_a_readable_message():
    result = run_cli("--prompt-ids", "1,2,99999", "--json")
    assert result.returncode == 1 and "outside the vocabulary" in result.stderr
    result = subprocess.run([sys.executable, "-m", "backend", "generate", "--model", "/nonexistent", "--prompt",
                             "hi"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "config.json" in result.stderr
