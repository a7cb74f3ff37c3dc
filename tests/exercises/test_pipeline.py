"""Tests for multigpu.exercises.pipeline: 16's checker passes the reference 1F1B
and names each mistake learners make; a deadlocking order is ended by the timeout
and leaves no process behind."""

import multiprocessing
import time

from multigpu.exercises.pipeline import check_one_f_one_b
from multigpu.pipeline import one_f_one_b_actions
from tests.exercises import wrong_pipeline


def test_check_passes_the_reference():
    passed, message = check_one_f_one_b(one_f_one_b_actions)
    assert passed, message
    assert message == (
        "PASS: 1F1B on 4 stages with 6 micro-batches: no deadlock, 4, 3, 2, 1 "
        "micro-batches in flight at most on stages 0-3 (p - s), idle 0.3333 of the "
        "step as (p-1)/(m+p-1), gradients equal to one process within 1e-12."
    )


def test_check_passes_even_stages_sending_first():
    passed, message = check_one_f_one_b(wrong_pipeline.even_stages_send_first)
    assert passed, message


def test_check_ends_a_deadlock_with_the_timeout_and_no_process_left():
    start = time.monotonic()
    passed, message = check_one_f_one_b(
        wrong_pipeline.one_after_the_other, message_timeout=2.0
    )
    assert not passed
    assert message.startswith(
        "FAIL: deadlock: the ranks waited 2 s and gave up (stage 0 waits in "
        "send_activation(3); stage 1 waits in send_activation(2); stage 2 waits in "
        "send_activation(1); stage 3 waits in send_gradient(0)). gloo's send waits "
        "until the neighbour posts the matching receive"
    )
    assert message.endswith(
        "a send and a receive that happen at the same moment were posted one after "
        "the other instead of together, as one action (section 4)."
    )
    assert "[(" not in message  # names the mistake, never the lists that fix it
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == []


def test_check_names_gpipe_order():
    passed, message = check_one_f_one_b(wrong_pipeline.gpipe_order)
    assert not passed
    assert message.startswith(
        "FAIL: stage 0 holds the activations of 6 micro-batches at once; 1F1B holds "
        "at most p - s = 4. That is GPipe's order"
    )


def test_check_names_one_warmup_forward_too_many_not_gpipe():
    passed, message = check_one_f_one_b(wrong_pipeline.one_warmup_forward_too_many)
    assert not passed
    assert message == (
        "FAIL: stage 0 holds the activations of 5 micro-batches at once; 1F1B holds "
        "at most p - s = 4. It runs 5 forwards before its first backward: too many "
        "warm-up forwards for this stage. Each stage's warm-up count depends on its "
        "distance from the last stage: a stage nearer the end gets its first "
        "gradient back sooner, so it starts backwards after fewer forwards."
    )
    assert "GPipe" not in message


def test_check_names_the_same_warmup_on_every_stage():
    passed, message = check_one_f_one_b(wrong_pipeline.same_warmup_on_every_stage)
    assert not passed
    assert message.startswith(
        "FAIL: stage 1 holds the activations of 4 micro-batches at once; 1F1B holds "
        "at most p - s = 3. It runs 4 forwards before its first backward: too many "
        "warm-up forwards for this stage. Each stage's warm-up count depends on its "
        "distance from the last stage"
    )


def test_check_names_a_missing_send():
    passed, message = check_one_f_one_b(wrong_pipeline.forgets_the_last_send)
    assert not passed
    assert message.startswith(
        "FAIL: stage 1 never does send_gradient(3): a neighbour would wait for it "
        "forever."
    )


def test_check_names_an_extra_send():
    passed, message = check_one_f_one_b(wrong_pipeline.last_stage_sends_activations)
    assert not passed
    assert message.startswith(
        "FAIL: stage 3 has no next stage, yet it does send_activation(0): an extra "
        "message to a rank that does not exist."
    )


def test_check_names_the_wrong_microbatch_order():
    passed, message = check_one_f_one_b(wrong_pipeline.cooldown_in_reverse)
    assert not passed
    assert message.startswith(
        "FAIL: wrong micro-batch order: stage 0 receives gradient(5) but stage 1 sent "
        "gradient(3) at that point."
    )


def test_check_names_a_pipeline_without_warmup():
    passed, message = check_one_f_one_b(wrong_pipeline.no_warmup)
    assert not passed
    assert message.startswith(
        "FAIL: no deadlock and few activations, but the stages sit idle 75% of the "
        "step, not 1F1B's (p-1)/(m+p-1) = 33%: the stages do not overlap. Stage 0 "
        "runs 1 forward(s) before its first backward: too few warm-up forwards for "
        "this stage"
    )


def test_check_names_an_empty_template_and_an_error():
    passed, message = check_one_f_one_b(lambda stage, p, m: [])
    assert (passed, message) == (False, "FAIL: stage 0 never does forward(0).")

    def broken(stage, num_stages, num_microbatches):
        raise NameError("name 'warmup' is not defined")

    passed, message = check_one_f_one_b(broken)
    assert message == (
        "FAIL: your function raised an error for stage 0: NameError: name 'warmup' "
        "is not defined"
    )
