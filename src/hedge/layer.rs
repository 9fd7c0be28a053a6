use tower_layer::Layer;

use super::Hedge;
use crate::policy::Policies;

/// Applies gRFC A6 hedging to a service: see [the module docs](crate::hedge).
///
/// Every parameter lives in the [`HedgePolicy`](crate::HedgePolicy) of each method (built
/// with a builder, not positional arguments) and in the shared [`Policies`] table.
#[derive(Debug, Clone)]
pub struct HedgeLayer {
    policies: Policies,
}

impl HedgeLayer {
    /// A layer that hedges the methods that `policies` gives a
    /// [`HedgePolicy`](crate::HedgePolicy).
    pub fn new(policies: Policies) -> HedgeLayer {
        HedgeLayer { policies }
    }

    /// The policy table.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }
}

impl<S> Layer<S> for HedgeLayer {
    type Service = Hedge<S>;

    fn layer(&self, inner: S) -> Hedge<S> {
        Hedge::new(inner, self.policies.clone())
    }
}
