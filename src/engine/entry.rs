//! A call's entry, the same for every driver: its policy looked up, its plan made, and the
//! A6 throttle's deposit paid.

use std::time::Instant;

use http::Method;

use super::rules::{CallFacts, Start, TableFacts, nothing_applies, plan};
use crate::policy::{MethodPolicy, Policies, ThrottleHandle};

/// What the engine asks a driver of a call as it enters, each only when it needs it.
pub(crate) trait Entrance {
    /// Whether a call without a policy is driven, given what the table says (its transparent
    /// retries). The `grpc` interceptor has no transparent retries to make, but drives a
    /// call with a deadline to keep it.
    fn drive_without_policy(&self, table_says: bool) -> bool {
        table_says
    }

    /// What the request says of its call; read only for a call the engine may drive.
    fn facts(&self) -> CallFacts<'_>;

    /// The call's handle on `policy`. The layers keep a copy per service clone, so that
    /// calls on different cores do not share one reference count.
    fn policy(&mut self, policy: &MethodPolicy) -> MethodPolicy {
        policy.clone()
    }

    /// The throttle the call's attempts answer to, if the table has one for it.
    fn throttle(&mut self) -> Option<ThrottleHandle>;
}

/// Enters a call with `method` and `path` into `policies`: `None` when nothing of A6
/// applies and the driver hands it on as it is. `now` is read only where a timeout or an
/// adaptive hedging delay needs it.
pub(crate) fn enter(
    policies: &Policies,
    method: &Method,
    path: &str,
    entrance: &mut impl Entrance,
    now: &dyn Fn() -> Instant,
) -> Option<Start> {
    let matched = policies.matched(method, path);
    let mut table = TableFacts::of(policies);
    table.drive_without_policy = entrance.drive_without_policy(table.drive_without_policy);
    // Decided before the request's headers are read.
    if nothing_applies(matched.map(|m| m.policy), &table) {
        return None;
    }
    let policy = matched.map(|m| entrance.policy(m.policy));
    let throttle = entrance.throttle();
    if let (Some(MethodPolicy::Retry(_) | MethodPolicy::Hedge(_)), Some(throttle)) =
        (&policy, &throttle)
    {
        // A budget's deposit: calls without a policy make no retries to pay for.
        throttle.on_call();
    }
    let route = matched.and_then(|m| m.route);
    plan(policy, &table, &entrance.facts(), throttle, route, now)
}
