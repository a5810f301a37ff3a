"""Results tied to the outcome (queueflow.member.agent.outputs, judge): the pure rules, with
hypothesis properties over every handler return form."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import queueflow
from queueflow.member.agent.outputs import (
    COPY_OF_RECORD,
    DEAD_LETTER_HEADER,
    USE_RECORD_KEY,
    DeadLetter,
    InvalidResult,
    Outbound,
    Result,
    Routes,
    Send,
    Yielded,
    generator_outcome,
    sort_outputs,
)
from queueflow.member.agent.results import Failure, Raised, Returned, TimedOut, judge
from queueflow.structs import AcknowledgeType, ShareRecord

ACCEPT, RELEASE, REJECT = queueflow.ACCEPT, queueflow.RELEASE, queueflow.REJECT
ROUTES = Routes(sinks=("out", "audit"), dead_letter="dlq", group="g")


def record(offset: int = 7, key: bytes | None = b"k") -> ShareRecord:
    return ShareRecord(
        "jobs",
        2,
        offset,
        key.decode() if key else None,  # decoded key; the raw one is kept
        {"decoded": True},
        [("h", b"v")],
        1000,
        3,
        raw_value=b"raw-value",
        raw_key=key,
    )


def test_public_names_are_exported() -> None:
    assert queueflow.Send is Send and queueflow.DeadLetter is DeadLetter
    assert queueflow.Result is Result
    assert queueflow.USE_RECORD_KEY is USE_RECORD_KEY and queueflow.COPY_OF_RECORD is COPY_OF_RECORD
    assert pickle.loads(pickle.dumps(USE_RECORD_KEY)) is USE_RECORD_KEY
    assert repr(COPY_OF_RECORD) == "queueflow.COPY_OF_RECORD"


def test_accept_publishes_sends_and_plain_values_with_the_record_key() -> None:
    r = record()
    out = sort_outputs(
        ACCEPT,
        [1, Send("x", 2), Send(None, 3, key="k2", headers={"a": b"b"}, partition=1), DeadLetter()],
        r,
        ROUTES,
    )
    assert out == (
        Outbound("out", b"k", 1),
        Outbound("audit", b"k", 1),
        Outbound("x", b"k", 2),
        Outbound("out", "k2", 3, (("a", b"b"),), 1),
        Outbound("audit", "k2", 3, (("a", b"b"),), 1),
    )


def test_reject_publishes_dead_letters_only_and_the_copy_by_default() -> None:
    r = record()
    (copy,) = sort_outputs(REJECT, [1, Send("x", 2)], r, ROUTES)
    assert copy.to == "dlq" and copy.raw
    assert (copy.key, copy.value) == (b"k", b"raw-value")
    headers = dict(copy.headers)
    assert headers["h"] == b"v"
    assert headers[DEAD_LETTER_HEADER + "group"] == b"g"
    assert headers[DEAD_LETTER_HEADER + "topic"] == b"jobs"
    assert headers[DEAD_LETTER_HEADER + "partition"] == b"2"
    assert headers[DEAD_LETTER_HEADER + "offset"] == b"7"
    assert headers[DEAD_LETTER_HEADER + "delivery_count"] == b"3"
    assert headers[DEAD_LETTER_HEADER + "reason"] == b"rejected"
    given_one = sort_outputs(REJECT, [DeadLetter({"why": 1}, reason="bad", to="other")], r, ROUTES)
    assert [(o.to, o.value, o.raw) for o in given_one] == [("other", {"why": 1}, False)]
    assert dict(given_one[0].headers)[DEAD_LETTER_HEADER + "reason"] == b"bad"
    assert sort_outputs(REJECT, [], r, Routes(("out",))) == ()


def test_release_publishes_nothing() -> None:
    assert sort_outputs(RELEASE, [1, Send("x", 2), DeadLetter()], record(), ROUTES) == ()


@pytest.mark.parametrize(
    ("outcome", "values", "routes", "message"),
    [
        (ACCEPT, [1], Routes(), "no sink="),
        (ACCEPT, [Send(None, 1)], Routes(), "no sink="),
        (REJECT, [DeadLetter()], Routes(), "no dead_letter="),
        (ACCEPT, [RELEASE], ROUTES, "among the results"),
    ],
)
def test_results_that_cant_be_routed_are_invalid(
    outcome: AcknowledgeType, values: list[Any], routes: Routes, message: str
) -> None:
    with pytest.raises(InvalidResult, match=message):
        sort_outputs(outcome, values, record(), routes)


def test_generator_outcome_rules() -> None:
    assert generator_outcome([1, 2]) == (ACCEPT, [1, 2])
    assert generator_outcome([1, REJECT]) == (REJECT, [1])
    for bad, message in [
        ([ACCEPT, RELEASE], "second outcome"),
        ([RELEASE, 1], "after the outcome"),
        ([AcknowledgeType.RENEW], "not an outcome"),
    ]:
        with pytest.raises(InvalidResult, match=message):
            generator_outcome(bad)


def test_judge_ties_results_to_the_outcome() -> None:
    r = [record()]
    plain = judge(Returned(Result(ACCEPT, [1])), r, False, ROUTES)
    assert plain.outcomes == (ACCEPT,) and plain.outputs is not None
    assert [o.to for o in plain.outputs[0]] == ["out", "audit"]
    assert judge(Returned(ACCEPT), r, False, ROUTES).outputs is None
    copy = judge(Returned(REJECT), r, False, ROUTES)
    assert copy.outputs is not None and copy.outputs[0][0].to == "dlq"
    assert judge(Returned(REJECT), r, False, None).outputs is None
    yielded = judge(Returned(Yielded([Send("x", 1), RELEASE])), r, False, None)
    assert (yielded.outcomes, yielded.outputs) == ((RELEASE,), None)
    invalid = judge(Returned(Result(ACCEPT, [1])), r, False, None)
    assert invalid.failure is Failure.INVALID_RESULT and invalid.outputs is None
    assert "no sink=" in (invalid.detail or "")
    assert invalid.handler_errors == 1
    assert (
        judge(Returned(Result(ACCEPT, "abc")), r, False, ROUTES).failure is Failure.INVALID_RESULT
    )
    assert judge(Returned(Result("yes", [])), r, False, ROUTES).failure is Failure.INVALID_RESULT  # type: ignore[arg-type]
    assert judge(Returned(Result(None, [1])), r, False, ROUTES).outcomes == (ACCEPT,)


def test_batch_handlers_give_a_result_per_record() -> None:
    rs = [record(1), record(2), record(3)]
    value = [Result(ACCEPT, [Send("x", 1)]), None, Result(REJECT, [DeadLetter(to="d")])]
    result = judge(Returned(value), rs, True, None)
    assert result.outcomes == (ACCEPT, ACCEPT, REJECT)
    assert result.outputs is not None
    assert [[o.to for o in per] for per in result.outputs] == [["x"], [], ["d"]]
    whole = judge(Returned(RELEASE), rs, True, ROUTES)
    assert whole.outcomes == (RELEASE,) * 3 and whole.outputs is None
    assert judge(Returned(value[:2]), rs, True, None).failure is Failure.INVALID_OUTCOME


# -- properties ------------------------------------------------------------------------------

OUTCOME = st.sampled_from([ACCEPT, RELEASE, REJECT])
ITEM = st.one_of(
    st.integers(),
    st.builds(Send, st.sampled_from(["x", "y", None]), st.integers()),
    st.builds(DeadLetter, st.one_of(st.just(COPY_OF_RECORD), st.integers()), st.none(), st.none()),
)
ITEMS = st.lists(ITEM, max_size=6)
ROUTES_ANY = st.builds(
    Routes, st.sampled_from([(), ("out",), ("out", "audit")]), st.sampled_from([None, "dlq"])
)


def forms(outcome: AcknowledgeType, items: list[Any]) -> list[Any]:
    """The same outcome and results as each handler return form."""
    return [Result(outcome, items), Yielded([*items, outcome])]


@given(OUTCOME, ITEMS, ROUTES_ANY)
def test_a_released_record_never_publishes(
    outcome: AcknowledgeType, items: list[Any], routes: Routes
) -> None:
    for value in forms(RELEASE, items):
        result = judge(Returned(value), [record()], False, routes)
        assert result.outcomes == (RELEASE,)
        assert result.outputs is None


@given(OUTCOME, ITEMS, ROUTES_ANY)
def test_reject_publishes_only_dead_letters(
    outcome: AcknowledgeType, items: list[Any], routes: Routes
) -> None:
    for value in forms(REJECT, items):
        result = judge(Returned(value), [record()], False, routes)
        if result.failure is not None:  # a DeadLetter without to= on an agent without one
            assert result.failure is Failure.INVALID_RESULT and result.outputs is None
            continue
        published = result.outputs[0] if result.outputs else ()
        letters = [i for i in items if isinstance(i, DeadLetter)]
        expected = len(letters) or (1 if routes.dead_letter else 0)
        assert len(published) == expected
        assert all(dict(o.headers).get(DEAD_LETTER_HEADER + "offset") == b"7" for o in published)


@given(ITEMS, ROUTES_ANY)
def test_accept_publishes_exactly_its_results(items: list[Any], routes: Routes) -> None:
    for value in forms(ACCEPT, items):
        result = judge(Returned(value), [record()], False, routes)
        if result.failure is not None:
            assert result.failure is Failure.INVALID_RESULT and not routes.sinks
            continue
        published = result.outputs[0] if result.outputs else ()
        fanout = len(routes.sinks)
        expected = sum(
            0 if isinstance(i, DeadLetter) else (1 if isinstance(i, Send) and i.to else fanout)
            for i in items
        )
        assert len(published) == expected
        assert not any(o.raw for o in published)


@given(ITEMS, ROUTES_ANY, st.sampled_from([TimedOut(), Raised(ValueError("x"))]))
def test_a_failed_call_publishes_nothing(items: list[Any], routes: Routes, ended: Any) -> None:
    result = judge(ended, [record(), record(8)], True, routes)
    assert result.outcomes == (RELEASE, RELEASE) and result.outputs is None
