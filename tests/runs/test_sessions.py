"""Which journaled runs a command may take (runs/sessions.py): none of an earlier command by
default; with --resume its own last session's (the latest of the same command and
experiment, a journal from before sessions as one); with --reuse any."""

from __future__ import annotations

from bisect_prefetch.runs.sessions import NOT_IN_SCOPE, Scope


def _record(session, variant="search+c@fp"):
    return {"variant": variant, **({"session": session} if session is not None else {})}


JOURNAL = [_record("aa/1-1-a", "aa+c@fp"), _record("bisect/2-2-b"), _record("bisect/3-3-c"),
           _record("bisect/4-4-d", "search+c@other"), _record("aa/5-5-e", "aa+c@fp")]


def test_by_default_no_run_of_an_earlier_command_is_taken():
    scope = Scope("bisect")
    scope.decide(JOURNAL, fingerprint="fp")
    assert not scope.resumed and scope.session.startswith("bisect/")
    assert all(scope.admits(r) == NOT_IN_SCOPE for r in JOURNAL)
    assert Scope("bisect").session != scope.session  # one command, one session


def test_resume_continues_the_latest_session_of_the_same_command_and_experiment():
    scope = Scope("bisect", resume=True)
    scope.decide(JOURNAL, fingerprint="fp")
    assert (scope.resumed, scope.session) == (True, "bisect/3-3-c")
    assert [scope.admits(r) is None for r in JOURNAL] == [False, False, True, False, False]
    matrix = Scope("matrix:m", resume=True, per_experiment=False)
    matrix.decide([_record("matrix:m/1-1-a", "matrix:x+c@one"),
                   _record("matrix:n/2-2-b", "matrix:x+c@two")], fingerprint="two")
    assert matrix.session == "matrix:m/1-1-a"  # its cells override the experiment


def test_a_journal_from_before_sessions_is_resumed_as_one():
    scope = Scope("bisect", resume=True)
    scope.decide([_record(None), _record(None)], fingerprint="fp")
    assert (scope.resumed, scope.session) == (True, None)
    assert scope.admits(_record(None)) is None and scope.admits(_record("aa/1-1-a")) is not None


def test_reuse_admits_every_earlier_run_and_the_checks_decide():
    scope = Scope("aa", earlier=True)
    scope.decide(JOURNAL, fingerprint="fp")
    assert all(scope.admits(r) is None for r in JOURNAL)
