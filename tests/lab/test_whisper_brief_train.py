"""lab/whisper_brief_train.py's pure parts (its training run is minutes: never run here): the
docstring sentences it speaks, the label rows it pads, its learning-rate schedule."""
import pytest

from lab.whisper_brief_train import END, IGNORE, batch, schedule, sentences


def test_sentences_keep_what_a_speaker_says_as_written():
    doc = ("Return the low median of numeric data.  When the number of data points is\n"
           "odd, the middle value is returned. Short one. Call f(x) with x as int. "
           "See e.g. the manual for more details here. Use a; or b as the separator here. "
           "There are 42 items in this particular list. Why does this happen to the parser?")
    assert sentences(doc) == [
        "Return the low median of numeric data.",
        "When the number of data points is odd, the middle value is returned.",
        "Why does this happen to the parser?"]
    # over WORDS' 20 words: a run-on no speaker says in one window's breath
    assert sentences(" ".join(["word"] * 21).capitalize() + ".") == []


def test_batch_pads_inputs_with_the_end_and_targets_from_the_prompts_last():
    prompt = [7, 8, 9, 10]
    rows = [[*prompt, 1, 2, END], [*prompt, 3, END]]
    inputs, targets = batch(rows, len(prompt))
    assert inputs.tolist() == [[7, 8, 9, 10, 1, 2], [7, 8, 9, 10, 3, END]]
    # position 3 (the prompt's last id) predicts the first sentence token; the prompt's own
    # ids are never targets, nor is anything after a row's end
    assert targets.tolist() == [[IGNORE, IGNORE, IGNORE, 1, 2, END],
                                [IGNORE, IGNORE, IGNORE, 3, END, IGNORE]]


def test_schedule_warms_up_then_falls_to_a_tenth():
    steps, warmup = 100, 10
    assert schedule(0, steps, warmup) == pytest.approx(0.1)
    assert schedule(9, steps, warmup) == pytest.approx(1.0)
    assert schedule(10, steps, warmup) == pytest.approx(1.0)
    assert schedule(steps - 1, steps, warmup) == pytest.approx(0.1)
    factors = [schedule(s, steps, warmup) for s in range(warmup, steps)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))  # cosine: never rises again
