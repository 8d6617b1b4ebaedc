//! The conformance checker on hand-written traces: conforming ones pass,
//! and a step the model does not allow is reported with its reason.

use idem_model::trace::{Event, KeyMode, TraceConfig, check, check_ordered};

fn trace(lines: &str) -> Vec<Event> {
    Event::parse_lines(lines).expect("a well-formed trace")
}

fn complete(max_attempts: u8) -> TraceConfig {
    TraceConfig {
        complete: true,
        ..TraceConfig::new(max_attempts)
    }
}

/// One successful attempt of message `msg` under `owner`.
fn success(msg: i64, attempt: i32, owner: &str) -> String {
    let c = format!(r#""msg":{msg},"attempt":{attempt},"owner":"{owner}""#);
    [
        format!(r#"{{"kind":"claim",{c},"outcome":"ok"}}"#),
        format!(r#"{{"kind":"fenced_update",{c},"held":true}}"#),
        format!(r#"{{"kind":"guard",{c},"done":false}}"#),
        format!(r#"{{"kind":"effect",{c}}}"#),
        format!(r#"{{"kind":"transition",{c},"ok":true}}"#),
        format!(r#"{{"kind":"commit",{c},"outcome":"ok","dup":false}}"#),
        format!(r#"{{"kind":"marker",{c}}}"#),
    ]
    .join("\n")
}

#[test]
fn every_documented_example_parses() {
    let doc = include_str!("../src/trace/mod.rs");
    let examples: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("//! {"))
        .collect();
    assert!(
        examples.len() >= 14,
        "the examples at the top of trace/mod.rs"
    );
    for e in examples {
        let json = format!("{{{e}");
        serde_json::from_str::<Event>(&json).unwrap_or_else(|err| panic!("{json}: {err}"));
    }
}

#[test]
fn a_successful_delivery_conforms() {
    let events = trace(&success(7, 1, "r1#1"));
    let report = check(&events, &complete(3)).expect("conforms");
    assert_eq!(report.events, 7);
    assert_eq!(report.messages, 1);
    assert_eq!(report.claims, 1);
}

#[test]
fn a_failing_message_retried_then_dead_lettered_conforms() {
    let mut lines = Vec::new();
    for (attempt, owner, dead) in [(1, "r1#1", false), (2, "r2#1", true)] {
        let c = format!(r#""msg":7,"attempt":{attempt},"owner":"{owner}""#);
        lines.extend([
            format!(r#"{{"kind":"claim",{c},"outcome":"ok"}}"#),
            format!(r#"{{"kind":"fenced_update",{c},"held":true}}"#),
            format!(r#"{{"kind":"guard",{c},"done":false}}"#),
            format!(r#"{{"kind":"effect",{c}}}"#),
            format!(r#"{{"kind":"transition",{c},"ok":false}}"#),
            format!(
                r#"{{"kind":"settle",{c},"dead":{dead},"retryable":true,"applied":true,"topic":"t"}}"#
            ),
        ]);
    }
    let report = check(&trace(&lines.join("\n")), &complete(2)).expect("conforms");
    assert_eq!(report.events, 12);
}

#[test]
fn a_retry_past_max_attempts_is_a_violation() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":false}
{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true}
"#;
    let v = check(&trace(lines), &TraceConfig::new(1)).expect_err("attempt 1 of 1 is the last");
    assert_eq!(v.index, 2);
    assert!(v.reason.contains("a retry"), "{v}");
}

#[test]
fn a_lost_commit_read_back_as_landed_conforms() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"lost_ack"}
{"kind":"claim_read_back","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":true}
{"kind":"commit","msg":7,"attempt":1,"owner":"r1#1","outcome":"lost_ack","dup":false}
{"kind":"landed","msg":7,"attempt":1,"owner":"r1#1","success":true}
"#;
    check(&trace(lines), &complete(3)).expect("conforms");
}

#[test]
fn a_lost_commit_not_landed_is_retried_and_acts_once() {
    // The commit never reached the server: the read-back says so, the
    // bookkeeping retries, and the retry executes (the only effect).
    let lines = format!(
        r#"
{{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}}
{{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}}
{{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}}
{{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}}
{{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":true}}
{{"kind":"commit","msg":7,"attempt":1,"owner":"r1#1","outcome":"lost_ack","dup":false}}
{{"kind":"landed","msg":7,"attempt":1,"owner":"r1#1","success":false}}
{{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true}}
{}"#,
        success(7, 2, "r2#1")
    );
    check(&trace(&lines), &complete(3)).expect("conforms");
}

#[test]
fn a_settle_the_fence_refuses_is_a_violation() {
    // r1's lease ran out, r2 claimed the message: r1's bookkeeping,
    // fenced by owner and attempt, must change nothing.
    let base = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"claim","msg":7,"attempt":2,"owner":"r2#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":false}
"#;
    let refused = format!(
        "{base}{}",
        r#"{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":false}"#
    );
    check(&trace(&refused), &TraceConfig::new(3)).expect("the fence refused: conforms");
    let applied = format!(
        "{base}{}",
        r#"{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true}"#
    );
    let v = check(&trace(&applied), &TraceConfig::new(3)).expect_err("the fence must refuse");
    assert_eq!(v.index, 3);
    assert_eq!(v.msg, 7);
    assert!(v.reason.contains("refuses"), "{v}");
}

#[test]
fn an_unfenced_success_update_is_a_violation() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"claim","msg":7,"attempt":2,"owner":"r2#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
"#;
    let v = check(&trace(lines), &TraceConfig::new(3)).expect_err("another claim holds the row");
    assert_eq!(v.index, 2);
    assert!(v.reason.contains("refuses"), "{v}");
}

#[test]
fn an_effect_committed_twice_is_a_violation() {
    // The second delivery's state check finds the action not done,
    // although the first delivery's commit was acknowledged.
    let lines = format!(
        "{}\n{}",
        success(7, 1, "r1#1"),
        r#"{"kind":"claim","msg":7,"attempt":2,"owner":"r2#1","outcome":"ok"}"#
    );
    let v = check(&trace(&lines), &TraceConfig::new(3)).expect_err("the message is a success");
    assert_eq!(v.index, 7);
    assert!(v.reason.contains("not claimable"), "{v}");

    // Twice in one delivery: the body's write, then another.
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
"#;
    let v = check(&trace(lines), &TraceConfig::new(3)).expect_err("one effect per delivery");
    assert_eq!(v.index, 4);

    // A lost commit whose bookkeeping found nothing to change may have
    // landed or not (a write given up looks the same): the retry's state
    // check tells, and an effect found not done is the only one.
    let lines = format!(
        r#"
{{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}}
{{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}}
{{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}}
{{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}}
{{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":true}}
{{"kind":"commit","msg":7,"attempt":1,"owner":"r1#1","outcome":"lost_ack","dup":false}}
{{"kind":"landed","msg":7,"attempt":1,"owner":"r1#1","success":false}}
{{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":false}}
{}"#,
        success(7, 2, "r2#1")
    );
    check(&trace(&lines), &complete(3)).expect("the first commit did not land");
}

#[test]
fn a_relay_killed_mid_delivery_conforms() {
    // r1 dies inside its handler's transaction (its events stop): the
    // transaction aborts, the lease runs out, r2 delivers.
    let lines = format!(
        r#"
{{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}}
{{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}}
{{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}}
{{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}}
{}"#,
        success(7, 2, "r2#1")
    );
    let report = check(&trace(&lines), &complete(3)).expect("conforms");
    assert_eq!(report.claims, 2);
}

#[test]
fn a_batch_beside_a_failed_handler_conforms() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r3#2","outcome":"ok"}
{"kind":"claim","msg":8,"attempt":1,"owner":"r3#2","outcome":"ok"}
{"kind":"batch_open","owner":"r3#2","renewed":[7,8]}
{"kind":"guard","msg":7,"attempt":1,"owner":"r3#2","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r3#2"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r3#2","ok":true}
{"kind":"guard","msg":8,"attempt":1,"owner":"r3#2","done":false}
{"kind":"effect","msg":8,"attempt":1,"owner":"r3#2"}
{"kind":"transition","msg":8,"attempt":1,"owner":"r3#2","ok":false}
{"kind":"batch_commit","owner":"r3#2","outcome":"ok"}
{"kind":"marker","msg":7,"attempt":1,"owner":"r3#2"}
{"kind":"settle","msg":8,"attempt":1,"owner":"r3#2","dead":false,"retryable":true,"applied":true}
"#;
    let report = check(&trace(lines), &TraceConfig::new(3)).expect("conforms");
    assert_eq!(report.messages, 2);
    assert_eq!(report.events, 12);
    // Two batch events, each a step of both rows.
    assert_eq!(report.steps, 14);
}

#[test]
fn a_marker_before_the_commit_is_a_violation() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":true}
{"kind":"marker","msg":7,"attempt":1,"owner":"r1#1"}
"#;
    let v = check(&trace(lines), &TraceConfig::new(3)).expect_err("no marker before the commit");
    assert_eq!(v.index, 5);
}

#[test]
fn a_publisher_route_conforms_and_its_lost_mark_is_read_back() {
    let lines = r#"
{"kind":"claim","msg":9,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"effect","msg":9,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":9,"attempt":1,"owner":"r1#1","ok":true}
{"kind":"relay_mark","msg":9,"attempt":1,"owner":"r1#1","applied":true}
"#;
    check(&trace(lines), &complete(3)).expect("conforms");
    // A publish, then a dead letter by the same attempt: refused.
    let lines = r#"
{"kind":"claim","msg":9,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"effect","msg":9,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":9,"attempt":1,"owner":"r1#1","ok":true}
{"kind":"settle","msg":9,"attempt":1,"owner":"r1#1","dead":true,"retryable":false,"applied":true}
"#;
    let v = check(&trace(lines), &TraceConfig::new(3)).expect_err("a published message");
    assert_eq!(v.index, 3);
}

#[test]
fn messages_not_asked_for_are_skipped() {
    let lines = format!("{}\n{}", success(7, 1, "r1#1"), success(8, 1, "r1#2"));
    let config = TraceConfig {
        messages: Some(vec![8]),
        ..complete(3)
    };
    let report = check(&trace(&lines), &config).expect("conforms");
    assert_eq!(report.ignored, 7);
    assert_eq!(report.events, 7);
    assert_eq!(report.messages, 1);
}

#[test]
fn an_event_of_an_unknown_claim_is_a_violation() {
    let lines = r#"{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}"#;
    let v = check(&trace(lines), &TraceConfig::new(3)).expect_err("no claim");
    assert_eq!(v.index, 0);
}

#[test]
fn failure_bookkeeping_in_the_handlers_transaction_conforms() {
    // Issue 23's fix: rolled back to the savepoint after the fenced
    // update, the failure written in the same transaction, committed.
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":false}
{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true,"in_tx":true}
{"kind":"commit","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok","dup":false}
{"kind":"claim","msg":7,"attempt":2,"owner":"r2#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":2,"owner":"r2#1","held":true}
{"kind":"guard","msg":7,"attempt":2,"owner":"r2#1","done":false}
{"kind":"effect","msg":7,"attempt":2,"owner":"r2#1"}
{"kind":"transition","msg":7,"attempt":2,"owner":"r2#1","ok":false}
{"kind":"settle","msg":7,"attempt":2,"owner":"r2#1","dead":true,"retryable":true,"applied":true,"in_tx":true}
{"kind":"commit","msg":7,"attempt":2,"owner":"r2#1","outcome":"lost_ack","dup":false}
{"kind":"settle","msg":7,"attempt":2,"owner":"r2#1","dead":true,"retryable":true,"applied":false}
"#;
    check(&trace(lines), &complete(2)).expect("conforms");
    // The same transaction's bookkeeping may not be retried past the last
    // attempt.
    let wrong = lines.replace(
        r#""attempt":2,"owner":"r2#1","dead":true,"retryable":true,"applied":true,"in_tx":true"#,
        r#""attempt":2,"owner":"r2#1","dead":false,"retryable":true,"applied":true,"in_tx":true"#,
    );
    let v = check(&trace(&wrong), &complete(2)).expect_err("attempt 2 of 2 is the last");
    assert_eq!(v.index, 12);
}

#[test]
fn a_batch_recording_its_failure_beside_the_success_update_conforms() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r3#2","outcome":"ok"}
{"kind":"claim","msg":8,"attempt":1,"owner":"r3#2","outcome":"ok"}
{"kind":"batch_open","owner":"r3#2","renewed":[7,8]}
{"kind":"guard","msg":7,"attempt":1,"owner":"r3#2","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r3#2"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r3#2","ok":true}
{"kind":"guard","msg":8,"attempt":1,"owner":"r3#2","done":false}
{"kind":"effect","msg":8,"attempt":1,"owner":"r3#2"}
{"kind":"transition","msg":8,"attempt":1,"owner":"r3#2","ok":false}
{"kind":"settle","msg":8,"attempt":1,"owner":"r3#2","dead":true,"retryable":true,"applied":true,"in_tx":true}
{"kind":"batch_commit","owner":"r3#2","outcome":"ok"}
"#;
    check(&trace(lines), &complete(1)).expect("conforms");
}

#[test]
fn a_killed_process_s_unreported_claim_is_allowed_only_when_processes_were_killed() {
    // Claim 1 never reported: its process died just after committing it.
    let lines = success(7, 2, "r2#1");
    let killed = TraceConfig {
        killed: true,
        ..complete(3)
    };
    check(&trace(&lines), &killed).expect("a claim lost with its process");
    let v = check(&trace(&lines), &complete(3)).expect_err("no process was killed");
    assert!(v.reason.contains("the claim wrote attempt 2"), "{v}");
}

#[test]
fn a_killed_process_may_have_taken_one_more_step_unreported() {
    // The process died just after its handler's commit, before reporting
    // it: the message is a success that no event shows.
    let c = r#""msg":7,"attempt":1,"owner":"r1#1""#;
    let lines = [
        format!(r#"{{"kind":"claim",{c},"outcome":"ok"}}"#),
        format!(r#"{{"kind":"fenced_update",{c},"held":true}}"#),
        format!(r#"{{"kind":"guard",{c},"done":false}}"#),
        format!(r#"{{"kind":"effect",{c}}}"#),
        format!(r#"{{"kind":"transition",{c},"ok":true}}"#),
    ]
    .join("\n");
    let killed = TraceConfig {
        killed: true,
        ..complete(3)
    };
    check(&trace(&lines), &killed).expect("the unreported commit settled it");
    let v = check(&trace(&lines), &complete(3)).expect_err("without a kill, nothing settled it");
    assert!(v.reason.contains("still"), "{v}");
}

#[test]
fn an_aborted_call_then_its_retry_conforms() {
    // The first attempt's state check fails (a lost connection): its
    // transaction aborts, the relay books a retry; the second acts.
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"aborted","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true}
{"kind":"claim","msg":7,"attempt":2,"owner":"r1#2","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":2,"owner":"r1#2","held":true}
{"kind":"guard","msg":7,"attempt":2,"owner":"r1#2","done":false}
{"kind":"effect","msg":7,"attempt":2,"owner":"r1#2"}
{"kind":"transition","msg":7,"attempt":2,"owner":"r1#2","ok":true}
{"kind":"commit","msg":7,"attempt":2,"owner":"r1#2","outcome":"ok","dup":false}
{"kind":"renew","msg":7,"attempt":2,"owner":"r1#2","renewed":false}
"#;
    // The last event: a heartbeat in flight when its delivery ended.
    check(&trace(lines), &complete(3)).expect("conforms");
    // A heartbeat that renewed after its delivery ended is not.
    let late = lines.replace(
        r#""owner":"r1#2","renewed":false"#,
        r#""owner":"r1#2","renewed":true"#,
    );
    check(&trace(&late), &complete(3)).expect_err("renewed after the end");
}

/// Seen in the conformance runs (about 1 in 25 on a loaded machine): a
/// failure booked in the handler's transaction, whose commit's
/// acknowledgement was lost, and another relay claiming the message (the
/// booking released the lease) before the first relay's fallback
/// bookkeeping. No lease ran out.
const CLAIM_AFTER_A_LOST_BOOKING_COMMIT: &str = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"a#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"a#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"a#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"a#1"}
{"kind":"aborted","msg":7,"attempt":1,"owner":"a#1"}
{"kind":"settle","msg":7,"attempt":1,"owner":"a#1","dead":false,"retryable":true,"applied":true,"in_tx":true}
{"kind":"commit","msg":7,"attempt":1,"owner":"a#1","outcome":"lost_ack","dup":false}
{"kind":"claim","msg":7,"attempt":2,"owner":"b#1","outcome":"ok"}
{"kind":"settle","msg":7,"attempt":1,"owner":"a#1","dead":false,"retryable":true,"applied":false}
{"kind":"fenced_update","msg":7,"attempt":2,"owner":"b#1","held":true}
{"kind":"guard","msg":7,"attempt":2,"owner":"b#1","done":false}
{"kind":"effect","msg":7,"attempt":2,"owner":"b#1"}
{"kind":"transition","msg":7,"attempt":2,"owner":"b#1","ok":true}
{"kind":"commit","msg":7,"attempt":2,"owner":"b#1","outcome":"lost_ack","dup":false}
{"kind":"landed","msg":7,"attempt":2,"owner":"b#1","success":true}
"#;

#[test]
fn a_claim_after_a_lost_booking_commit_is_no_stall() {
    let report = check(&trace(CLAIM_AFTER_A_LOST_BOOKING_COMMIT), &complete(3)).expect("conforms");
    assert_eq!(report.stalls, 0, "{report:?}");
}

/// The control: a claim while the first relay runs its handler outside any
/// transaction (between its claim and its fenced update), which only a
/// lease that ran out allows, is still counted as a stall.
#[test]
fn control_a_claim_under_a_running_handler_is_a_stall() {
    let lines = r#"
{"kind":"claim","msg":7,"attempt":1,"owner":"a#1","outcome":"ok"}
{"kind":"claim","msg":7,"attempt":2,"owner":"b#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":2,"owner":"b#1","held":true}
{"kind":"guard","msg":7,"attempt":2,"owner":"b#1","done":false}
{"kind":"effect","msg":7,"attempt":2,"owner":"b#1"}
{"kind":"transition","msg":7,"attempt":2,"owner":"b#1","ok":true}
{"kind":"commit","msg":7,"attempt":2,"owner":"b#1","outcome":"ok","dup":false}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"a#1","held":false}
"#;
    let report = check(&trace(lines), &complete(3)).expect("conforms, with a stall");
    assert_eq!(report.stalls, 1, "{report:?}");
}

/// `lines` with every claim carrying the ordering key `key`.
fn keyed(lines: &str, key: &str) -> String {
    lines
        .lines()
        .map(|l| match l.contains(r#""kind":"claim""#) {
            true => l.replace(r#""outcome":"#, &format!(r#""key":"{key}","outcome":"#)),
            false => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One failing attempt of `msg`, its bookkeeping in the handler's
/// transaction (`dead`: dead-lettered).
fn failure(msg: i64, attempt: i32, owner: &str, dead: bool) -> String {
    let c = format!(r#""msg":{msg},"attempt":{attempt},"owner":"{owner}""#);
    [
        format!(r#"{{"kind":"claim",{c},"outcome":"ok"}}"#),
        format!(r#"{{"kind":"fenced_update",{c},"held":true}}"#),
        format!(r#"{{"kind":"guard",{c},"done":false}}"#),
        format!(r#"{{"kind":"effect",{c}}}"#),
        format!(r#"{{"kind":"transition",{c},"ok":false}}"#),
        format!(
            r#"{{"kind":"settle",{c},"dead":{dead},"retryable":true,"applied":true,"in_tx":true}}"#
        ),
        format!(r#"{{"kind":"commit",{c},"outcome":"ok","dup":false}}"#),
    ]
    .join("\n")
}

#[test]
fn a_key_delivered_in_order_conforms() {
    // 7 fails once (holding its key), then succeeds; 8 and 9 follow, and
    // a message without a key runs beside them.
    let lines = [
        keyed(&failure(7, 1, "r1#1", false), "k"),
        success(20, 1, "r2#1"),
        keyed(&success(7, 2, "r2#2"), "k"),
        keyed(&success(8, 1, "r1#2"), "k"),
        keyed(&success(9, 1, "r2#3"), "k"),
    ]
    .join("\n");
    let report = check(&trace(&lines), &complete(3)).expect("conforms");
    assert_eq!(report.keyed_claims, 4);
    assert_eq!(report.messages, 4);
}

#[test]
fn a_key_goes_on_past_its_dead_letter_unless_held() {
    let lines = [
        keyed(&failure(7, 1, "r1#1", false), "k"),
        keyed(&failure(7, 2, "r1#2", true), "k"),
        keyed(&success(8, 1, "r2#1"), "k"),
    ]
    .join("\n");
    let events = trace(&lines);
    check(&events, &complete(2)).expect("Continue: conforms");
    let v = check_ordered(&events, &complete(2), KeyMode::Hold).expect_err("held behind 7");
    assert_eq!(v.msg, 8);
    assert_eq!(v.index, 14);
    assert!(v.reason.contains("dead-lettered"), "{v}");
}

#[test]
fn a_claim_out_of_its_key_s_order_is_a_violation() {
    // 8 claimed while 7, before it in the key, is still to be retried.
    let lines = [
        keyed(&failure(7, 1, "r1#1", false), "k"),
        keyed(&success(8, 1, "r2#1"), "k"),
    ]
    .join("\n");
    let v = check(&trace(&lines), &TraceConfig::new(3)).expect_err("7 is pending");
    assert_eq!((v.index, v.msg), (7, 8));
    assert_eq!(
        v.reason,
        "claimed against the head rule of its ordering key \"k\": message 7, before it in \
         its key, is not settled yet (still pending)"
    );
    // Under another key, or none, the same claim conforms.
    let other = [
        keyed(&failure(7, 1, "r1#1", false), "k"),
        keyed(&success(8, 1, "r2#1"), "other"),
        success(9, 1, "r2#2"),
    ]
    .join("\n");
    check(&trace(&other), &TraceConfig::new(3)).expect("conforms");
}

#[test]
fn two_messages_of_a_key_in_flight_is_a_violation() {
    // 8 claimed first (7's insert committed after it: see finding 6),
    // then 7 while 8 is still running.
    let c8 = r#""msg":8,"attempt":1,"owner":"r1#1""#;
    let lines = [
        keyed(&format!(r#"{{"kind":"claim",{c8},"outcome":"ok"}}"#), "k"),
        format!(r#"{{"kind":"fenced_update",{c8},"held":true}}"#),
        keyed(&success(7, 1, "r2#1"), "k"),
        format!(r#"{{"kind":"guard",{c8},"done":false}}"#),
    ]
    .join("\n");
    let v = check(&trace(&lines), &TraceConfig::new(3)).expect_err("8 is in flight");
    assert_eq!((v.index, v.msg), (2, 7));
    assert_eq!(
        v.reason,
        "claimed against the head rule of its ordering key \"k\": message 8 of its key is in \
         flight (held by its claim r1#1, attempt 1)"
    );
    // Once 8 settled, 7 may be claimed (the head rule orders what it sees).
    let settled = [
        keyed(&success(8, 1, "r1#1"), "k"),
        keyed(&success(7, 1, "r2#1"), "k"),
    ]
    .join("\n");
    check(&trace(&settled), &complete(3)).expect("conforms");
}

#[test]
fn a_crashed_claim_of_the_key_s_head_blocks_until_reclaimed() {
    // r1 dies holding 7: 8 must wait until 7 is claimed again and ends.
    let crashed = r#"{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}"#;
    let early = [keyed(crashed, "k"), keyed(&success(8, 1, "r2#1"), "k")].join("\n");
    let v = check(&trace(&early), &TraceConfig::new(3)).expect_err("7 is pending");
    assert!(v.reason.contains("message 7"), "{v}");
    let late = [
        keyed(crashed, "k"),
        keyed(&success(7, 2, "r2#1"), "k"),
        keyed(&success(8, 1, "r2#2"), "k"),
    ]
    .join("\n");
    check(&trace(&late), &complete(3)).expect("conforms");
}

#[test]
fn a_claim_after_a_lost_commit_tells_it_landed() {
    // 7's commit lost its acknowledgement and its read-back failed: its
    // bookkeeping may retry it (the commit never reached the server), but
    // not once 8's claim showed it landed.
    let lost = keyed(
        r#"{"kind":"claim","msg":7,"attempt":1,"owner":"r1#1","outcome":"ok"}
{"kind":"fenced_update","msg":7,"attempt":1,"owner":"r1#1","held":true}
{"kind":"guard","msg":7,"attempt":1,"owner":"r1#1","done":false}
{"kind":"effect","msg":7,"attempt":1,"owner":"r1#1"}
{"kind":"transition","msg":7,"attempt":1,"owner":"r1#1","ok":true}
{"kind":"commit","msg":7,"attempt":1,"owner":"r1#1","outcome":"lost_ack","dup":false}
{"kind":"landed","msg":7,"attempt":1,"owner":"r1#1","success":false}"#,
        "k",
    );
    let claim8 = keyed(
        r#"{"kind":"claim","msg":8,"attempt":1,"owner":"r2#1","outcome":"ok"}"#,
        "k",
    );
    let retry = r#"{"kind":"settle","msg":7,"attempt":1,"owner":"r1#1","dead":false,"retryable":true,"applied":true}"#;
    let unseen = [lost.clone(), retry.to_owned()].join("\n");
    check(&trace(&unseen), &TraceConfig::new(3)).expect("conforms");
    let after = [lost.clone(), claim8.clone()].join("\n");
    check(&trace(&after), &TraceConfig::new(3)).expect("7 landed: conforms");
    let both = [lost, claim8, retry.to_owned()].join("\n");
    let v = check(&trace(&both), &TraceConfig::new(3)).expect_err("8's claim saw 7 landed");
    assert_eq!((v.index, v.msg), (8, 7));
    assert!(v.reason.contains("refuses"), "{v}");
}

#[test]
fn a_message_claimed_under_two_keys_is_a_violation() {
    let lines = [
        keyed(&failure(7, 1, "r1#1", false), "a"),
        keyed(&success(7, 2, "r1#2"), "b"),
    ]
    .join("\n");
    let v = check(&trace(&lines), &TraceConfig::new(3)).expect_err("one key per message");
    assert!(v.reason.contains("earlier claim had"), "{v}");
}
