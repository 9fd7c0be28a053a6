use tower_layer::Layer;

use super::Retry;
use crate::policy::Policies;

/// Applies gRFC A6 retries and hedging to a service, each call by its method's policy: see
/// [the module docs](crate::retry). [`HedgeLayer`](crate::HedgeLayer) is this type.
#[derive(Debug, Clone)]
pub struct RetryLayer {
    policies: Policies,
}

impl RetryLayer {
    /// A layer that retries the methods that `policies` gives a
    /// [`RetryPolicy`](crate::RetryPolicy) and hedges those it gives a
    /// [`HedgePolicy`](crate::HedgePolicy).
    pub fn new(policies: Policies) -> RetryLayer {
        RetryLayer { policies }
    }

    /// The policy table.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::new(inner, self.policies.clone())
    }
}
