//! Compile-fail tests of the diagnostics the crate gives (trybuild, with the expected
//! `rustc` output checked in beside each case). trybuild builds the cases in a target
//! directory of its own, which costs a cold build of the crate: keep the cases few and small.
//!
//! A request body that cannot be replayed, in each of the forms a call takes. Where rustc
//! checks the layer's `Service` bounds one by one (a `Service` bound, `Service::call`, a
//! method called by its path), the `#[diagnostic::on_unimplemented]` of `Replay` gives the
//! error. Where it picks a `ServiceExt` method first (`svc.oneshot(..)`, `svc.ready()`), rustc
//! 1.95 reports the method's unsatisfied `Service<_>` bound and nothing of `Replay`; the README
//! ("Gateways (axum)") shows that error and what to do about it, and these cases keep it
//! honest.

const UI: &str = "tests/diagnostics/ui";

fn compile_fail(case: &str) {
    trybuild::TestCases::new().compile_fail(format!("{UI}/{case}.rs"));
}

#[test]
fn a_service_bound_on_a_body_that_cannot_be_replayed_names_the_replay_trait() {
    compile_fail("body_not_replayable");
}

#[test]
fn service_call_by_its_path_on_a_body_that_cannot_be_replayed_names_the_replay_trait() {
    compile_fail("call_by_path_not_replayable");
}

#[test]
fn oneshot_on_a_body_that_cannot_be_replayed_reports_an_unsatisfied_service_bound() {
    compile_fail("oneshot_not_replayable");
}

#[test]
fn ready_then_call_on_a_body_that_cannot_be_replayed_reports_an_unsatisfied_service_bound() {
    compile_fail("ready_call_not_replayable");
}
