"""The tools' inputs (`parse_sglang.tools.prompts`, `backends`): problems files and graders as a user
writes them, refused by name where malformed; a URL where no server answers is named."""

from __future__ import annotations

import json
import socket

import pytest

from parse_sglang.tools import backends, prompts


class _Tokenizer:
    """Chat template stand-in: the message's characters as ids after a two-id header."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        return [1, 2, *map(ord, messages[0]["content"])]


def test_problems_file_strings_questions_and_ids(tmp_path):
    path = tmp_path / "problems.json"
    path.write_text(json.dumps(["ab", {"question": "c", "answer": 3, "group": "t7"}, {"input_ids": [9, 8]}]))
    problems = prompts.read_problems(str(path))
    assert prompts.prompt_ids(problems, _Tokenizer()) == [[1, 2, 97, 98], [1, 2, 99], [9, 8]]
    assert [prompts.group_of(p, i) for i, p in enumerate(problems)] == [0, "t7", 2]


@pytest.mark.parametrize(
    "content, message",
    [
        ("[]", "non-empty JSON list"),
        ("{", "allowed is a JSON list"),
        ('[{"answer": 1}]', "problem 0 is .*allowed is a string or an object"),
        ('["a", {"input_ids": ["x"]}]', "problem 1 is"),
    ],
)
def test_malformed_problems_files_are_refused_by_name(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"--prompts='.*p.json' is invalid: .*{message}"):
        prompts.read_problems(str(path))


def test_grader_returns_a_bool_or_outcome_and_bool(tmp_path, monkeypatch):
    (tmp_path / "my_grader.py").write_text(
        "def right(problem, text):\n    return text == problem['answer']\n"
        "def final(problem, text):\n    return text[-1], text[-1] == problem['answer']\n"
        "def broken(problem, text):\n    return 'yes'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert prompts.load_grader("my_grader:right")({"answer": "7"}, "7") == (True, True)
    assert prompts.load_grader("my_grader:final")({"answer": "7"}, "x 8") == ("8", False)
    with pytest.raises(TypeError, match="it returned 'yes'; allowed is a bool or"):
        prompts.load_grader("my_grader:broken")({}, "")
    for spec in ("my_grader", "my_grader:missing", "no_such_module_x:f"):
        with pytest.raises(ValueError, match=rf"--grader='{spec}' is invalid"):
            prompts.load_grader(spec)


def test_engine_args_and_a_silent_url_are_refused_by_name():
    with pytest.raises(ValueError, match="--engine-args='.*' is invalid: allowed is a JSON object with model_path"):
        backends.parse_engine_args('{"tp_size": 2}', "--engine-args")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing answers there
        with pytest.raises(
            RuntimeError, match=rf"--url='http://127.0.0.1:{port}' is invalid: no SGLang server answers"
        ):
            backends.HttpServer(f"http://127.0.0.1:{port}").get_server_info()
