"""The prompt window's layout and bounds (gpu_worker.prompt_window); the engine-level proof that the
prefix cache serves it is in test_continuity.py."""

from __future__ import annotations

from gpu_worker.orpheus import END_OF_AI, END_OF_SPEECH, FRAME_SECONDS, START_OF_HUMAN, audio_id
from gpu_worker.prompt_window import PromptWindow, WindowLimits

PROMPT = [START_OF_HUMAN, 128000, 11, 12, 128009, 128260, 128261, 128257]


def audio(frames: int, start: int = 0) -> list[int]:
    return [audio_id(k % 7, (start + k) % 4096) for k in range(7 * frames)]


def test_a_turn_is_the_request_s_prompt_its_generated_ids_and_the_end_markers():
    window = PromptWindow(WindowLimits())
    generated = [*audio(3), END_OF_SPEECH]
    window.add(PROMPT, generated)
    assert window.ids == [*PROMPT, *audio(3), END_OF_SPEECH, END_OF_AI]
    window.add(PROMPT, audio(2, 9))  # ended by length: no END_OF_SPEECH generated, the markers still close it
    assert window.ids == [*PROMPT, *audio(3), END_OF_SPEECH, END_OF_AI, *PROMPT, *audio(2, 9), END_OF_SPEECH, END_OF_AI]


def test_the_next_request_starts_with_every_token_of_the_previous_one():
    """What makes the prefix cache hit: request n's prompt begins with request n-1's whole prompt
    (its window included) and then the ids it generated, in order."""
    window = PromptWindow(WindowLimits())
    previous = [*window.before(4096), *PROMPT]
    generated = audio(5)
    window.add(PROMPT, generated)
    second = [*window.before(4096), *PROMPT]
    assert second[:len(previous) + len(generated)] == [*previous, *generated]
    window.add(PROMPT, audio(4, 3))
    third = [*window.before(4096), *PROMPT]
    assert third[:len(second)] == second


def test_the_window_grows_then_restarts_from_the_newest_turn_at_either_bound():
    turn = len(PROMPT) + 7 * 10 + 2
    window = PromptWindow(WindowLimits(max_tokens=3 * turn, max_audio_s=100))
    for i in range(3):
        window.add(PROMPT, audio(10, i))
    assert len(window.ids) == 3 * turn
    window.add(PROMPT, audio(10, 7))  # a fourth would pass the token bound: the window is the newest turn
    assert window.ids == [*PROMPT, *audio(10, 7), END_OF_SPEECH, END_OF_AI]

    seconds = PromptWindow(WindowLimits(max_tokens=10_000, max_audio_s=25 * FRAME_SECONDS))
    seconds.add(PROMPT, audio(10))
    seconds.add(PROMPT, audio(10, 1))
    assert len(seconds.ids) == 2 * turn
    seconds.add(PROMPT, audio(10, 2))  # 30 frames > 25: restart
    assert len(seconds.ids) == turn

    alone = PromptWindow(WindowLimits(max_tokens=turn - 1, max_audio_s=100))
    alone.add(PROMPT, audio(10))  # one turn past the bound: nothing is kept
    assert alone.ids == []


def test_a_window_that_does_not_fit_beside_the_prompt_gives_its_newest_turns():
    turn = len(PROMPT) + 7 * 4 + 2
    window = PromptWindow(WindowLimits())
    for i in range(3):
        window.add(PROMPT, audio(4, i))
    assert window.before(3 * turn) == window.ids
    assert window.before(2 * turn + 5) == window.ids[turn:]
    assert window.before(turn - 1) == []
    window.clear()
    assert window.ids == []
