//! Compile-fail tests of the diagnostics the crate gives (trybuild, with the expected
//! `rustc` output checked in beside each case). trybuild builds the cases in a target
//! directory of its own, which costs a cold build of the crate: keep the cases few and small.

#[test]
fn a_body_that_cannot_be_replayed_names_the_replay_trait() {
    trybuild::TestCases::new().compile_fail("tests/diagnostics/ui/*.rs");
}
