"""Tokenizer folders: ids, bos/eos, the chat template in a sandbox, the ChatML fallback."""
import json
import shutil

import pytest

from kvlab.engine.tokenizer import TokenizerError, load_tokenizer

# A template in the style of MiniMind-3's tokenizer_config.json: namespace, reversed loops,
# `is string`, string methods, tojson, and an empty <think> block after the generation prompt.
MINIMIND_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}\n"
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and message.content is string and not message.content.startswith('<tool') %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if open_thinking is defined and open_thinking is true %}{{- '<think>\\n' }}"
    "{%- else %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n"
    "{%- endif %}"
)

QUESTION = [{"role": "user", "content": "가람 마을의 특산물은 무엇인가요?"}]


def with_template(src, dst, template):
    shutil.copytree(src, dst)
    config_path = dst / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if template is None:
        config.pop("chat_template")
    else:
        config["chat_template"] = template
    config_path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return dst


def test_special_ids_and_round_trip(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.vocab_size <= 400
    text = "민수는 가람 마을의 특산물은 배입니다."
    ids = tok.encode(text)
    assert tok.bos_id not in ids and tok.decode(ids) == text


def test_chatml_template_renders_and_encodes_specials(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    assert tok.has_chat_template
    text = tok.chat_text(QUESTION, add_generation_prompt=True)
    assert text == "<|im_start|>user\n가람 마을의 특산물은 무엇인가요?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids.count(2) == 1  # special tokens in the text map to their ids
    assert tok.chat_text(QUESTION, add_generation_prompt=False).endswith("<|im_end|>\n")


def test_minimind_style_template_renders(tokenizer_dir, tmp_path):
    tok = load_tokenizer(with_template(tokenizer_dir, tmp_path / "mm", MINIMIND_STYLE_TEMPLATE))
    system = [{"role": "system", "content": "친절하게 답하세요."}] + QUESTION
    assert tok.chat_text(system) == (
        "<|im_start|>system\n친절하게 답하세요.<|im_end|>\n"
        "<|im_start|>user\n가람 마을의 특산물은 무엇인가요?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    tools = tok.chat_text(QUESTION, tools=[{"name": "x"}], open_thinking=True)
    assert '{"name": "x"}' in tools and tools.endswith("assistant\n<think>\n")


def test_no_template_falls_back_to_chatml(tokenizer_dir, tmp_path):
    tok = load_tokenizer(with_template(tokenizer_dir, tmp_path / "plain", None))
    assert not tok.has_chat_template
    assert tok.chat_text(QUESTION) == "<|im_start|>user\n가람 마을의 특산물은 무엇인가요?<|im_end|>\n<|im_start|>assistant\n"


def test_template_reaching_python_internals_is_refused(tokenizer_dir, tmp_path):
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    tok = load_tokenizer(with_template(tokenizer_dir, tmp_path / "evil", evil))
    with pytest.raises(TokenizerError, match="sandbox"):
        tok.chat_text(QUESTION)


def test_folder_without_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_an_answer_cut_inside_a_character_leaves_that_character_out(tokenizer_dir):
    """A byte-level tokenizer spells a rare character in several byte tokens; an answer the token
    limit cut after its first bytes ends inside it. answer_text leaves the unfinished character out
    (decode alone shows U+FFFD); an answer that reached eos is cut there as before."""
    from kvlab.engine.tokenizer import BROKEN
    from kvlab.measure.steps import answer_text

    tokenizer = load_tokenizer(tokenizer_dir)
    text = "가나 龘"  # a character the Korean corpus never saw: its three UTF-8 bytes, a token each
    ids = tokenizer.encode(text)
    cut = next(end for end in range(len(ids), 0, -1) if tokenizer.decode(ids[:end]).endswith(BROKEN))
    assert answer_text(tokenizer, ids[:cut]) == tokenizer.decode(ids[:cut]).rstrip(BROKEN) == "가나 "
    assert BROKEN not in answer_text(tokenizer, ids[:cut])
    assert answer_text(tokenizer, ids) == text
    eos = tokenizer.encode(tokenizer.eos_token)
    assert answer_text(tokenizer, ids + eos + ids) == text
