//! Compile-fail and compile-pass tests of `#[idempotent]` and
//! `#[derive(State)]`. Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p idem-tests-build --test ui`, then read them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
