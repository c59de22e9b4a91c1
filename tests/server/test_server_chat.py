"""tinyt.server.chat without a server: a template renders the expected prompt, HF's named
templates pick 'default', and a bad message list or the template's own refusal is a 400."""
from types import SimpleNamespace

import pytest

pytest.importorskip("jinja2", reason="the serve extra is not installed")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from tinyt.errors import ApiError  # noqa: E402
from tinyt.server.chat import compile_template, render_chat  # noqa: E402

TOKENIZER = SimpleNamespace(bos_token=None, eos_token="<|endoftext|>")
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f"}]


def test_a_template_renders_the_prompt_with_the_generation_prompt():
    assert render_chat(compile_template(TEMPLATE), MESSAGES, TOKENIZER) == "s:be brief\nu:def f\na:"


def test_transformers_rendering_rules():
    # trim_blocks and lstrip_blocks: block tags leave no newline or indent behind
    template = compile_template("{{ bos_token }}\n  {% for m in messages %}\n"
                                "{{ m['content'] | tojson }}{{ eos_token }}\n"
                                "  {% endfor %}\n")
    tok = SimpleNamespace(bos_token="<s>", eos_token="</s>")
    assert render_chat(template, [{"role": "user", "content": "é\"x"}], tok) == \
        '<s>\n"é\\"x"</s>\n'  # tojson keeps non-ASCII as it is
    assert render_chat(compile_template("{{ bos_token }}|"), MESSAGES, TOKENIZER) == "|"


def test_named_templates_and_none():
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    assert compile_template(named).render() == "plain"
    assert compile_template([{"name": "only", "template": "one"}]).render() == "one"
    assert compile_template(None) is None and compile_template([]) is None


@pytest.mark.parametrize("messages", [
    [], "hi", [{"role": "user"}], [{"role": "user", "content": 3}], [["user", "hi"]]])
def test_bad_messages_are_a_400(messages):
    with pytest.raises(ApiError) as e:
        render_chat(compile_template(TEMPLATE), messages, TOKENIZER)
    assert (e.value.status, e.value.param) == (400, "messages")
    assert "'messages' must be a non-empty list" in e.value.message


def test_the_templates_own_refusal_is_a_400_with_its_words():
    template = compile_template("{% if messages[0]['role'] != 'user' %}"
                                "{{ raise_exception('the first message must be the user\\'s') }}"
                                "{% endif %}ok")
    assert render_chat(template, MESSAGES[1:], TOKENIZER) == "ok"
    with pytest.raises(ApiError) as e:
        render_chat(template, MESSAGES, TOKENIZER)
    assert (e.value.status, e.value.param) == (400, "messages")
    assert e.value.message == ("the chat template refused the messages: the first message "
                               "must be the user's")


def test_the_sandbox_refuses_unsafe_access():
    template = compile_template("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ApiError, match="the chat template refused the messages"):
        render_chat(template, MESSAGES, TOKENIZER)
