//! A hedge budget: hedges limited to a share of recent calls, plus a floor per second.

use std::fmt;
use std::time::Duration;

use super::{RetryBudget, RetryThrottle};
use crate::error::BuildError;

/// A budget for the extra load hedges add (Finagle's backup requests carry one, its
/// `maxExtraLoad`): over a sliding window, the hedges a policy sends may be at most
/// `ratio × calls`, plus `min_per_second` hedges per second so that a client with little
/// traffic can still hedge.
///
/// gRFC A6 gates hedges only on failures (the throttle). A backend that turns slow for every
/// call (overload, a GC pause, a slow disk) fails nothing, so a fixed hedging delay then sends
/// up to `maxAttempts` copies of every call, exactly when the fleet can least take them. With
/// a budget, a backup over it is not sent: the call keeps waiting on the attempts in flight
/// and sends no more backups (a non-fatal failure still sends its next hedge at once, as A6
/// says), and the refusal is counted (`MethodSnapshot::hedges_over_budget`, and with the
/// `opentelemetry` feature the `tower_retry_hedge.hedges_over_budget` counter). "The Tail
/// at Scale" (Dean and Barroso) keeps hedges to a few percent of the load; Finagle's
/// default is 1 %.
///
/// Give it to a hedging policy ([`HedgePolicyBuilder::budget`]); clones share one window, so
/// one budget can also be shared by several policies. Hedging policies get
/// [`HedgeBudget::default`] (5 % over 10 s, 2 per second) unless given another, whether built
/// in code or made from service-config JSON; [`HedgePolicyBuilder::budget`] and, for a whole
/// table, [`PoliciesBuilder::hedge_budget`] change it or turn it off. Time is
/// `tokio::time::Instant`, so it can be tested on tokio's paused clock.
///
/// [`HedgePolicyBuilder::budget`]: crate::policy::HedgePolicyBuilder::budget
/// [`PoliciesBuilder::hedge_budget`]: crate::policy::PoliciesBuilder::hedge_budget
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::throttle::HedgeBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Hedges at most 10 % of the calls of the last 10 s, no floor.
/// let budget = HedgeBudget::new(Duration::from_secs(10), 0, 0.1)?;
/// for _ in 0..20 {
///     budget.on_call();
/// }
/// assert!(budget.try_hedge()); // 1 of 2
/// assert!(budget.try_hedge()); // 2 of 2
/// assert!(!budget.try_hedge()); // 20 calls × 0.1 spent
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HedgeBudget(RetryBudget);

impl HedgeBudget {
    /// A budget over a window of `window` (1 s to 60 s), with a floor of `min_per_second`
    /// hedges per second and `ratio` (0 to 1000) hedges per call.
    pub fn new(
        window: Duration,
        min_per_second: u32,
        ratio: f64,
    ) -> Result<HedgeBudget, BuildError> {
        RetryBudget::new(window, min_per_second, ratio).map(HedgeBudget)
    }

    /// Counts a call of a policy with this budget: its share of hedges goes into the window.
    pub fn on_call(&self) {
        self.0.on_call();
    }

    /// Takes one hedge from the budget if there is one left; `false` when the hedge must not
    /// be sent.
    pub fn try_hedge(&self) -> bool {
        self.0.allows_retry()
    }

    /// Gives back a hedge that [`try_hedge`](Self::try_hedge) let through and that was not
    /// sent after all (the throttle refused it).
    pub(crate) fn give_back(&self) {
        self.0.give_back();
    }

    /// Hedges still allowed now (rounded down).
    pub fn remaining(&self) -> u64 {
        self.0.remaining()
    }

    /// The window over which calls and hedges are counted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::throttle::HedgeBudget;
    ///
    /// let budget = HedgeBudget::default();
    /// assert_eq!(budget.window(), Duration::from_secs(10));
    /// assert_eq!((budget.min_per_second(), budget.ratio()), (2, 0.05));
    /// ```
    pub fn window(&self) -> Duration {
        self.0.window()
    }

    /// The hedges allowed per second whatever the calls.
    pub fn min_per_second(&self) -> u32 {
        self.0.min_per_second()
    }

    /// The hedges allowed per call in the window.
    pub fn ratio(&self) -> f64 {
        self.0.ratio()
    }
}

impl Default for HedgeBudget {
    /// 5 % of the calls over a 10 s window, and 2 hedges per second: a client that sends a
    /// few calls in 10 s may hedge each of them as A6 says (20 hedges, enough for four
    /// calls of 5 attempts that all go slow), while sustained slowness adds 5 % of the calls
    /// and 2 hedges per second (400 calls, 16 at a time, against a backend that answers every
    /// call after 100 ms: 40 hedges, +10 %).
    fn default() -> HedgeBudget {
        HedgeBudget::new(Duration::from_secs(10), 2, 0.05).expect("valid default budget")
    }
}

impl fmt::Debug for HedgeBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HedgeBudget").field(&self.0).finish()
    }
}
