//! A call's books: what the engine recorded of it, posted to the statistics of its route or
//! method as it goes ([`Action::Post`](super::Action::Post)), and to the table's A96 metrics
//! when it ends ([`Engine::close`]). Every driver posts through here, so a call gives the
//! same figures whichever driver runs it.

use std::sync::Arc;

use super::Engine;
use crate::policy::Policies;
use crate::stats::{MethodStats, Records};

/// Where a call's books go: the statistics of the route it matched, else of its method.
#[derive(Clone, Copy)]
pub(crate) struct Books<'a> {
    pub(crate) policies: &'a Policies,
    pub(crate) route: Option<usize>,
    /// The request's path: the method's name, for a call that matched no route.
    pub(crate) path: &'a str,
    /// The request's authority, for the A96 metrics' target label.
    #[cfg(feature = "opentelemetry")]
    pub(crate) authority: Option<&'a str>,
    /// The request's extensions, where gRFC A108's custom label is read from.
    #[cfg(feature = "opentelemetry")]
    pub(crate) extensions: Option<&'a http::Extensions>,
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

    /// Adds what the engine recorded to the statistics.
    pub(crate) fn post(&self, records: &Records) {
        self.method_stats().add(records);
    }
}

impl Engine {
    /// The call ends, returned or dropped: posts what the engine recorded since the last
    /// [`Action::Post`](super::Action::Post) to the `books` made, and records the call in the
    /// table's A96 metrics. Only the first close posts and records; a call of one attempt has
    /// nothing to post or record, and makes no books.
    pub(crate) fn close<'a>(&mut self, books: impl Fn() -> Books<'a>) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if let Some(records) = self.take_records() {
            books().post(&records);
        }
        #[cfg(feature = "opentelemetry")]
        if let Some(counts) = self.extra()
            && let books = books()
            && let Some(metrics) = books.policies.metrics()
        {
            let route = books.route.map(|route| books.policies.route_name(route));
            let extensions = books.extensions.filter(|_| metrics.records_custom_label());
            let labels = crate::metrics::Labels::of(
                books.path,
                self.rules.grpc,
                books.authority,
                route,
                extensions,
            );
            metrics.record(&counts, &labels);
        }
    }
}
