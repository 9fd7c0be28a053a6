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

    /// The policy `policies` gives a call with `method` and `path`, as the call's own handle
    /// on it, and the route it matched. The layers keep a copy of each policy per service
    /// clone, so that calls on different cores do not share one reference count, and
    /// remember the clone's last lookup.
    fn lookup(
        &mut self,
        policies: &Policies,
        method: &Method,
        path: &str,
    ) -> Option<(MethodPolicy, Option<usize>)> {
        let matched = policies.matched(method, path)?;
        Some((matched.policy.clone(), matched.route))
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
    let (policy, route) = entrance
        .lookup(policies, method, path)
        .map_or((None, None), |(policy, route)| (Some(policy), route));
    let mut table = TableFacts::of(policies);
    table.drive_without_policy = entrance.drive_without_policy(table.drive_without_policy);
    // Decided before the request's headers are read.
    if nothing_applies(policy.as_ref(), &table) {
        return None;
    }
    let throttle = entrance.throttle();
    if let (Some(MethodPolicy::Retry(_) | MethodPolicy::Hedge(_)), Some(throttle)) =
        (&policy, &throttle)
    {
        // A budget's deposit: calls without a policy make no retries to pay for.
        throttle.on_call();
    }
    plan(policy, &table, &entrance.facts(), throttle, route, now)
}
