//! A call's books: what the engine recorded of it, posted to the statistics of its route or
//! method as it goes, and to the table's A96 metrics when it ends. Every driver posts
//! through here, so a call gives the same figures whichever driver runs it.

use std::sync::Arc;

use super::Engine;
use crate::policy::Policies;
use crate::stats::MethodStats;

/// Where a call's books go: the statistics of the route it matched, else of its method.
#[derive(Clone, Copy)]
pub(crate) struct Books<'a> {
    pub(crate) policies: &'a Policies,
    pub(crate) route: Option<usize>,
    /// The request's path: the method's name, for a call that matched no route.
    pub(crate) path: &'a str,
}

impl Books<'_> {
    /// The statistics of the call's route or method.
    pub(crate) fn method_stats(&self) -> Arc<MethodStats> {
        let key = match self.route {
            Some(route) => self.policies.route_name(route),
            None => self.path,
        };
        self.policies.stats().method(key)
    }
}

impl Engine {
    /// Posts what the engine recorded since the last post. A call of one attempt has
    /// nothing to post, and looks nothing up.
    pub(crate) fn post(&mut self, books: Books<'_>) {
        if let Some(records) = self.take_records() {
            books.method_stats().add(&records);
        }
    }

    /// Records the call in the table's A96 metrics, with the labels `labels` gives for its
    /// route's name, whether it is a gRPC call, and whether the metrics take the custom
    /// label. A call of one attempt records nothing: the success path stops at the first
    /// test.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn close(
        &self,
        books: Books<'_>,
        labels: impl FnOnce(Option<&Arc<str>>, bool, bool) -> crate::metrics::Labels,
    ) {
        if let Some(counts) = self.extra()
            && let Some(metrics) = books.policies.metrics()
        {
            let route = books.route.map(|route| books.policies.route_name(route));
            let labels = labels(route, self.rules.grpc, metrics.records_custom_label());
            metrics.record(&counts, &labels);
        }
    }
}
